"""An engine that must be sent one fixed ``model`` name and answers with it: the rename.

MLX's server loads whatever model a request names, so a relayed request names the model it
was started with (``default_model``), and its replies, whole or streamed, carry that name
where the client expects the model it asked for. ``rename_request`` rewrites a request
body; ``Renamer`` rewrites reply bytes as they pass, holding back only a chunk's tail that
could be the start of a split ``"model"`` field, so a stream is never delayed by more than
those few bytes. Pure: bytes in, bytes out.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["Renamer", "rename_request"]

_decoder = msgspec.json.Decoder(dict[str, Any])


def rename_request(body: bytes, engine_name: str) -> bytes:
    """``body`` (a JSON object) with ``model`` set to ``engine_name``; other bytes unchanged
    in meaning. A body that is not a JSON object goes as it is: the engine refuses it."""
    try:
        doc = _decoder.decode(body)
    except msgspec.DecodeError:
        return body
    doc["model"] = engine_name
    return msgspec.json.encode(doc)


class Renamer:
    """Replaces the engine's name for the model with the one the client asked for, in the
    ``"model"`` fields of reply bytes fed in order (JSON, or SSE events of JSON)."""

    def __init__(self, engine_name: str, client_name: str) -> None:
        engine, client = msgspec.json.encode(engine_name), msgspec.json.encode(client_name)
        self._pairs = [(b'"model":' + sep + engine, b'"model":' + sep + client) for sep in (b"", b" ")]
        self._longest = max(len(old) for old, _ in self._pairs)
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        for old, new in self._pairs:
            data = data.replace(old, new)
        keep = self._partial_tail(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def whole(self, body: bytes) -> bytes:
        return self.feed(body) + self.flush()

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest tail of ``data`` that begins one of the patterns."""
        for n in range(min(len(data), self._longest - 1), 0, -1):
            tail = data[-n:]
            if any(old.startswith(tail) for old, _ in self._pairs):
                return n
        return 0
