"""An engine that must be sent one model name (MLX's server: ``default_model``) and answers
with it: requests are renamed on the way in, replies on the way out, split anywhere."""

from __future__ import annotations

import json

import pytest

from actors.config import EngineConfig
from actors.engines import llamacpp, mlx
from blazar.dialects.model_rename import Renamer, rename_request
from blazar.serve.relay import RenamingStream

STREAM = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model": "default_model","choices":'
    b'[{"index":0,"delta":{"content":"the \\"model\\": \\"default_model\\" text"}}]}\n\n'
    b'data: {"id":"c1","model":"default_model","choices":[],"usage":{"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)
RENAMED = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model": "qwen-mlx","choices":'
    b'[{"index":0,"delta":{"content":"the \\"model\\": \\"default_model\\" text"}}]}\n\n'
    b'data: {"id":"c1","model":"qwen-mlx","choices":[],"usage":{"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)


def test_the_request_names_the_engines_model() -> None:
    body = rename_request(b'{"model": "qwen-mlx", "messages": [], "stream": true}', "default_model")
    assert json.loads(body) == {"model": "default_model", "messages": [], "stream": True}
    assert rename_request(b"not json", "default_model") == b"not json"  # the engine refuses it


@pytest.mark.parametrize("cut", range(0, len(STREAM), 7))
def test_replies_are_renamed_wherever_a_chunk_is_cut(cut: int) -> None:
    r = Renamer("default_model", "qwen-mlx")
    out = r.feed(STREAM[:cut]) + r.feed(STREAM[cut:]) + r.flush()
    assert out == RENAMED  # and the model's own text that quotes the name is left alone


def test_a_whole_event_is_never_held_back() -> None:
    r = Renamer("default_model", "qwen-mlx")
    first = STREAM[: STREAM.index(b"\n\n") + 2]
    assert r.feed(first) == RENAMED[: RENAMED.index(b"\n\n") + 2]
    assert r.feed(b'data: {"model":"def') == b"data: {"  # a split field waits for its end
    assert r.feed(b'ault_model"}\n\n') == b'"model":"qwen-mlx"}\n\n'
    assert r.whole(b'{"model": "default_model"}') == b'{"model": "qwen-mlx"}'


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.closed = chunks, False

    async def receive_some(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    async def aclose(self) -> None:
        self.closed = True


class _Lease:
    released = False

    def release(self) -> None:
        self.released = True


async def _on_error(exc: Exception) -> bytes:
    return b""


async def test_a_renaming_stream_relays_renamed_chunks_then_ends() -> None:
    response, lease = _Response([STREAM[:50], STREAM[50:51], STREAM[51:]]), _Lease()
    stream = RenamingStream(response, lease, _on_error, rename=Renamer("default_model", "qwen-mlx"))  # type: ignore[arg-type]
    assert b"".join([chunk async for chunk in stream]) == RENAMED
    assert response.closed and lease.released


def test_only_the_lanes_that_need_it_rename() -> None:
    lane = mlx.lane(EngineConfig(), "/opt/mlx/bin/mlx_lm.server")
    assert lane is not None and lane.request_model == "default_model" == mlx.API.request_model
    assert llamacpp.lane(EngineConfig()).request_model is None
