"""The streaming resampler behind the piper host's 24 kHz ``pcm``: chunked equals whole,
the length is the rate ratio's, and a tone keeps its shape."""

from __future__ import annotations

import numpy as np
import pytest

from actors.engines.resample import Resampler, resample


def _tone(hz: float, rate: int, seconds: float = 1.0, amp: float = 8000.0) -> np.ndarray:
    return amp * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)


def _pcm(x: np.ndarray) -> bytes:
    return np.rint(x).astype("<i2").tobytes()


@pytest.mark.parametrize(("src", "dst"), [(22050, 24000), (16000, 24000), (22050, 16000), (48000, 24000)])
def test_a_tone_keeps_its_shape_and_the_length_follows_the_ratio(src: int, dst: int) -> None:
    out = np.frombuffer(resample(_pcm(_tone(440, src)), src, dst), dtype="<i2")
    assert len(out) == dst  # one second in, one second out
    expected = _tone(440, dst)
    assert np.abs(out[64:-64] - expected[64:-64]).max() < 12  # int16 rounding and the window


@pytest.mark.parametrize("chunk", [1, 7, 441, 1000, 5000])
def test_chunks_resampled_one_by_one_join_to_the_whole(chunk: int) -> None:
    pcm = _pcm(_tone(300, 22050, 0.5) + _tone(2100, 22050, 0.5, 3000))
    whole = resample(pcm, 22050, 24000)
    r = Resampler(22050, 24000)
    parts = [r.feed(pcm[i : i + 2 * chunk]) for i in range(0, len(pcm), 2 * chunk)]
    parts.append(r.flush())
    assert b"".join(parts) == whole


def test_the_same_rate_passes_bytes_through_and_feed_after_flush_is_refused() -> None:
    pcm = _pcm(_tone(440, 24000, 0.1))
    r = Resampler(24000, 24000)
    assert r.feed(pcm) == pcm and r.flush() == b""
    other = Resampler(22050, 24000)
    other.flush()
    with pytest.raises(ValueError):
        other.feed(pcm)


def test_a_loud_signal_is_clipped_not_wrapped() -> None:
    square = np.where(np.sin(2 * np.pi * 200 * np.arange(22050) / 22050) >= 0, 32767.0, -32768.0)
    out = np.frombuffer(resample(_pcm(square), 22050, 24000), dtype="<i2")
    assert out.max() == 32767 and out.min() == -32768  # overshoot (Gibbs) saturates
    plateaus = out[30 + 120 * np.arange(1, 190)]  # 200 Hz: the middle of each high half-period
    assert plateaus.min() > 30000  # a wrapped overshoot would be strongly negative
