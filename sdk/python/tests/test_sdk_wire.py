"""The SDK's transport-free half: every error envelope the daemon can send is read back to its
code, status and message, and streams that end early are reported (fast: no daemon)."""

from __future__ import annotations

import json

import pytest
from blazar.errors import CATALOG, Dialect, error_body

from blazar_sdk import BlazarError
from blazar_sdk._errors import error_from_body, error_from_event
from blazar_sdk._wire import ChatDecoder, PullDecoder, ResponseDecoder, resolve


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_catalog_code_reads_back_in_every_dialect(dialect: Dialect) -> None:
    # The daemon's own envelope builder (blazar/errors.py) against the SDK's reader.
    for code, info in CATALOG.items():
        body = json.dumps(error_body(dialect, code, f"what went wrong: {code}", param="field")).encode()
        err = error_from_body(info.status, body, {"retry-after": "3", "x-blazar-trace-id": "blz-1"})
        assert (err.blazar_code, err.status, err.message) == (code, info.status, f"what went wrong: {code}")
        assert err.retry_after_s == 3.0 and err.trace_id == "blz-1"
        if dialect is Dialect.OPENAI:
            assert err.param == "field"


def test_an_answer_without_a_code_keeps_its_status_and_text() -> None:
    err = error_from_body(502, b"<html>bad gateway</html>", {})
    assert (err.status, err.blazar_code) == (502, "SDK_BAD_RESPONSE") and "bad gateway" in err.message


def test_stream_error_events_of_each_shape() -> None:
    openai = error_from_event({"error": {"message": "crashed", "blazar_code": "ENGINE_CRASHED"}})
    ollama = error_from_event({"error": "crashed", "blazar_code": "ENGINE_CRASHED"})
    responses = error_from_event({"type": "error", "code": "ENGINE_CRASHED", "message": "crashed"})
    for err in (openai, ollama, responses):
        assert err is not None and (err.blazar_code, err.status, err.message) == (
            "ENGINE_CRASHED",
            None,
            "crashed",
        )
    assert error_from_event({"choices": []}) is None


def _feed(decoder: ChatDecoder | ResponseDecoder | PullDecoder, text: str) -> list[object]:
    out: list[object] = []
    for line in text.split("\n"):
        out += decoder.feed(line)
    return out


def test_chat_stream_without_done_is_cut() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
    decoder = ChatDecoder()
    got = _feed(decoder, f": keep-alive\n\ndata: {json.dumps(chunk)}\n\n")
    assert [c.text for c in got] == ["Hel"]  # type: ignore[attr-defined]
    with pytest.raises(BlazarError) as cut:
        decoder.end()
    assert cut.value.blazar_code == "SDK_STREAM_CUT"
    _feed(decoder, "data: [DONE]\n\n")
    decoder.end()


def test_responses_stream_needs_its_terminal_event() -> None:
    decoder = ResponseDecoder()
    delta = {"type": "response.output_text.delta", "delta": "Hi"}
    got = _feed(decoder, f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n")
    assert [e.delta for e in got] == ["Hi"]  # type: ignore[attr-defined]
    with pytest.raises(BlazarError):
        decoder.end()
    done = {"type": "response.completed", "response": {"status": "completed"}}
    _feed(decoder, f"event: response.completed\ndata: {json.dumps(done)}\n\n")
    decoder.end()


def test_pull_stream_ends_with_success_or_raises_its_error_line() -> None:
    decoder = PullDecoder()
    _feed(decoder, '{"status":"pulling manifest"}')
    with pytest.raises(BlazarError):
        decoder.end()
    with pytest.raises(BlazarError) as failed:
        _feed(decoder, '{"error":"no room","blazar_code":"INSUFFICIENT_STORAGE"}')
    assert failed.value.blazar_code == "INSUFFICIENT_STORAGE"


def test_url_and_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_URL", "http://localhost:9999/v1/")
    monkeypatch.setenv("BLAZAR_API_KEY", "sk-x")
    assert resolve(None, None) == ("http://localhost:9999", "sk-x")
    assert resolve("http://127.0.0.1:1", "") == ("http://127.0.0.1:1", "")
    monkeypatch.delenv("BLAZAR_URL")
    monkeypatch.delenv("BLAZAR_API_KEY")
    assert resolve(None, None) == ("http://127.0.0.1:11435", None)
