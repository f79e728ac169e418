"""Refusals that OpenAI or Anthropic also make are worded their way, beside our code."""

from __future__ import annotations

import msgspec
import pytest

from blazar.errors import prompt_too_long
from blazar.web.asgi.call import Call
from blazar.web.asgi.replies import exception_reply


def _answer(path: str, exc: Exception, **headers: str) -> tuple[int, dict[str, object]]:
    scope = {
        "method": "POST",
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    reply = exception_reply(Call(scope, trace_id="t", max_body=1 << 20), exc)
    assert isinstance(reply.body, bytes)
    return reply.status, msgspec.json.decode(reply.body)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_prompt_too_long_reads_as_anthropic_says_it(path: str) -> None:
    status, doc = _answer(path, prompt_too_long(5031, 4096))
    assert status == 400 and doc["blazar_code"] == "PROMPT_TOO_LONG"
    error = doc["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    message = error["message"]
    assert message.startswith("prompt is too long: 5031 tokens > 4096 maximum — ")
    assert "raise the context" in message


def test_prompt_too_long_reads_as_openai_says_it() -> None:
    status, doc = _answer("/v1/chat/completions", prompt_too_long(5031, 4096))
    error = doc["error"]
    assert status == 400 and isinstance(error, dict) and error["param"] == "messages"
    assert error["message"].startswith(
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 5031 tokens."
    )
    # A shared route called by an Anthropic client answers in Anthropic's shape and words.
    _, doc = _answer("/v1/chat/completions", prompt_too_long(9, 8), **{"anthropic-version": "2023-06-01"})
    assert doc["error"]["message"].startswith("prompt is too long: 9 tokens > 8 maximum")  # type: ignore[index]


def test_prompt_too_long_elsewhere_keeps_our_words() -> None:
    _, doc = _answer("/api/chat", prompt_too_long(5031, 4096))
    assert doc["error"] == prompt_too_long(5031, 4096).message and doc["blazar_code"] == "PROMPT_TOO_LONG"
