"""A streaming band-limited resampler for 16-bit mono PCM, with no I/O.

OpenAI's ``pcm`` is 24 kHz; a piper voice speaks at its own rate (22050 Hz for most).
``Resampler`` converts chunk by chunk as synthesis produces them: each output sample is
a windowed-sinc sum over ``taps`` input samples around its time, and the input a chunk
ends with is kept until the next chunk (or ``flush``) brings the samples it needs, so the
chunks joined are exactly the whole audio resampled at once. The output lags the input by
``taps / 2`` samples until ``flush``.
"""

from __future__ import annotations

from math import gcd

import numpy as np

__all__ = ["Resampler", "resample"]


class Resampler:
    """``src_hz`` to ``dst_hz``, fed little-endian int16 bytes, answering the same."""

    def __init__(self, src_hz: int, dst_hz: int, *, taps: int = 24) -> None:
        if src_hz <= 0 or dst_hz <= 0:
            raise ValueError("sample rates must be positive")
        g = gcd(src_hz, dst_hz)
        self.up, self.down = dst_hz // g, src_hz // g
        """Output sample ``j`` lies at input time ``j * down / up``."""
        self.half = max(2, taps // 2)
        # Below the lower of the two Nyquist frequencies: no aliasing when going down.
        self.cutoff = min(1.0, self.up / self.down)
        self._offsets = np.arange(-self.half + 1, self.half + 1)
        self._buf = np.zeros(self.half, dtype=np.float64)  # silence before the first sample
        self._start = -self.half
        """The input index of ``_buf[0]``."""
        self._fed = 0
        self._next = 0
        """The index of the next output sample."""
        self._done = False

    @property
    def identity(self) -> bool:
        return self.up == self.down

    def feed(self, pcm: bytes) -> bytes:
        """Resample the next chunk; what it can finish now (the rest comes later)."""
        if self._done:
            raise ValueError("feed after flush")
        if self.identity:
            return pcm
        samples = np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], dtype="<i2").astype(np.float64)
        self._fed += len(samples)
        self._buf = np.concatenate([self._buf, samples])
        return self._emit(self._start + len(self._buf) - self.half - 1, self._limit())

    def flush(self) -> bytes:
        """The end of the audio: the samples still held back, with silence after it."""
        if self._done or self.identity:
            self._done = True
            return b""
        self._done = True
        self._buf = np.concatenate([self._buf, np.zeros(self.half, dtype=np.float64)])
        return self._emit(self._start + len(self._buf) - self.half - 1, self._limit())

    def _limit(self) -> int:
        """How many output samples the input fed so far makes: ceil(fed * up / down)."""
        return -(-self._fed * self.up // self.down)

    def _emit(self, last_base: int, limit: int) -> bytes:
        """Every output sample whose window ends inside the buffer (its base at most
        ``last_base``) and that belongs to the audio (index below ``limit``)."""
        # largest j with j * down // up <= last_base
        stop = min(limit, ((last_base + 1) * self.up + self.down - 1) // self.down)
        if stop <= self._next:
            return b""
        js = np.arange(self._next, stop, dtype=np.int64)
        base = js * self.down // self.up
        frac = (js * self.down - base * self.up) / self.up
        dist = frac[:, None] - self._offsets[None, :]
        window = 0.5 * (1.0 + np.cos(np.pi * dist / (self.half + 1)))
        kernel = self.cutoff * np.sinc(self.cutoff * dist) * window
        idx = base[:, None] + self._offsets[None, :] - self._start
        out = np.sum(self._buf[idx] * kernel, axis=1)
        self._next = stop
        keep_from = self._next * self.down // self.up - self.half + 1 - self._start
        if keep_from > 0:
            self._buf = self._buf[keep_from:]
            self._start += keep_from
        return np.clip(np.rint(out), -32768, 32767).astype("<i2").tobytes()


def resample(pcm: bytes, src_hz: int, dst_hz: int) -> bytes:
    """All of ``pcm`` at once."""
    r = Resampler(src_hz, dst_hz)
    return r.feed(pcm) + r.flush()
