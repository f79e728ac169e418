"""Policy hooks on the real daemon and engine (SmolLM2): a real HTTP hook server started here
and Python entry points (``tests/policy_hook_entry.py``), before and after OpenAI chat and
Anthropic messages, whole and streamed. A hook allows, refuses (403 ``POLICY_REFUSED`` in the
caller's dialect, naming the hook), rewrites (the engine sees the rewritten prompt: its prompt
token count is that of the rewritten prompt sent plainly), redacts and refuses answers; a slow
hook fails open or closed as configured; a streamed answer is held for the hook that buffers
and passed by the one that does not, which the answer says."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.policy_hook_entry import PY_REDACTED, REDACTED, REWRITTEN_PROMPT, HookServer, hook_server
from tests.support import MODEL, ROOT, DaemonProc, add_key, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow


def _config(hooks_url: str) -> str:
    return f"""
slots = 2
default_ctx = 1024
audit_log = true
audit_prompts = true

[[hooks]]
name = "guard"
stage = "pre"
url = "{hooks_url}/pre"
timeout_ms = 500
on_error = "closed"

[[hooks]]
name = "py-guard"
stage = "pre"
entry = "tests.policy_hook_entry:py_pre"
timeout_ms = 300
on_error = "open"

[[hooks]]
name = "audit"
stage = "post"
url = "{hooks_url}/post"
timeout_ms = 5000
buffer_streams = true

[[hooks]]
name = "py-audit"
stage = "post"
entry = "tests.policy_hook_entry:py_post"
timeout_ms = 5000
routes = ["/v1/chat/completions"]
"""


class Daemon:
    def __init__(self, proc: DaemonProc, key: str, hooks: HookServer) -> None:
        self.url, self.hooks, self.home = proc.url, hooks, proc.home
        self.headers = {"Authorization": f"Bearer {key}"}
        self.sdk = openai.OpenAI(base_url=f"{proc.url}/v1", api_key=key, max_retries=0, timeout=120)

    def chat(self, content: str, **extra: Any) -> httpx.Response:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        }
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=self.headers, timeout=120)

    def messages(self, content: str, **extra: Any) -> httpx.Response:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        }
        headers = {**self.headers, "anthropic-version": "2023-06-01"}
        return httpx.post(f"{self.url}/v1/messages", json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Daemon]:
    with hook_server() as hooks:
        home = make_home(tmp_path_factory.mktemp("hooks") / "home", model_path, config=_config(hooks.url))
        key = add_key(home, "alice")
        proc = start_daemon(home, env={**home_env(home), "PYTHONPATH": str(ROOT)})
        try:
            yield Daemon(proc, key, hooks)
        finally:
            proc.stop()


def _policy(r: httpx.Response) -> dict[str, str]:
    return dict(item.split("=", 1) for item in r.headers["x-blazar-policy"].split(","))


def _sse_text(r: httpx.Response) -> str:
    text = ""
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or []:
                text += choice["delta"].get("content") or ""
    return text


def _sse_usage(r: httpx.Response) -> dict[str, Any]:
    for line in r.text.splitlines():
        if line.startswith("data: {") and (usage := json.loads(line[6:]).get("usage")):
            return dict(usage)
    raise AssertionError("the stream carried no usage")


def test_allowed_request_runs_and_each_hook_sees_the_neutral_request(daemon: Daemon) -> None:
    r = daemon.chat("What is 2 + 2?")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert _policy(r) == {"guard": "allow", "py-guard": "allow", "audit": "allow", "py-audit": "allow"}
    pre = next(p for p in reversed(daemon.hooks.seen) if p["stage"] == "pre")
    assert pre["key"] == "alice" and pre["model"] == MODEL and pre["dialect"] == "openai"
    assert pre["route"] == "/v1/chat/completions" and pre["version"] == 1
    assert pre["request"]["messages"] == [{"role": "user", "content": "What is 2 + 2?"}]
    post = next(p for p in reversed(daemon.hooks.seen) if p["stage"] == "post")
    assert post["answer"] == {"choice": 0, "text": r.json()["choices"][0]["message"]["content"]}
    assert post["stream"] is False


def test_a_refusal_is_a_403_naming_the_policy_in_each_dialect(daemon: Daemon) -> None:
    r = daemon.chat("Please REFUSE-REQUEST now")
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["blazar_code"] == "POLICY_REFUSED" and error["type"] == "permission_error"
    assert "'guard'" in error["message"] and "forbidden word" in error["message"]

    r = daemon.messages("Please REFUSE-REQUEST now")
    assert r.status_code == 403
    doc = r.json()
    assert doc["type"] == "error" and doc["error"]["type"] == "permission_error"
    assert doc["blazar_code"] == "POLICY_REFUSED" and "'guard'" in doc["error"]["message"]

    r = daemon.chat("Please REFUSE-REQUEST now", stream=True)
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "POLICY_REFUSED"


def test_a_rewritten_request_is_what_the_engine_runs(daemon: Daemon) -> None:
    plain = daemon.chat(REWRITTEN_PROMPT)
    assert plain.status_code == 200, plain.text
    expected = plain.json()["usage"]["prompt_tokens"]

    long_secret = "My SECRET password is hunter2 and my card number is 4111 1111 1111 1111, remember it"
    r = daemon.chat(long_secret)
    assert r.status_code == 200, r.text
    assert _policy(r)["guard"] == "rewrite"
    assert r.json()["usage"]["prompt_tokens"] == expected
    assert r.json()["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"]

    # streamed, the relayed body is the rewritten one too
    r = daemon.chat(long_secret, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200, r.text
    assert _sse_usage(r)["prompt_tokens"] == expected

    # Anthropic's route runs the rewritten request
    plain_a = daemon.messages(REWRITTEN_PROMPT)
    r = daemon.messages(long_secret)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == plain_a.json()["usage"]["input_tokens"]


def test_post_hooks_redact_and_refuse_answers(daemon: Daemon) -> None:
    r = daemon.chat("REDACT-ANSWER: what is the capital of France?")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == REDACTED
    assert _policy(r)["audit"] == "redact"

    r = daemon.chat("PY-REDACT: what is the capital of France?")
    assert r.json()["choices"][0]["message"]["content"] == PY_REDACTED
    assert _policy(r)["py-audit"] == "redact"

    r = daemon.messages("REDACT-ANSWER: what is the capital of France?")
    assert r.status_code == 200, r.text
    assert [b["text"] for b in r.json()["content"] if b["type"] == "text"] == [REDACTED]
    assert "py-audit" not in _policy(r)  # its routes leave /v1/messages out

    r = daemon.chat("REFUSE-ANSWER: what is the capital of France?")
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["blazar_code"] == "POLICY_REFUSED" and "'audit'" in error["message"]
    assert "the answer may not leave" in error["message"]


def test_a_slow_hook_fails_closed_or_open_as_configured(daemon: Daemon) -> None:
    t0 = time.monotonic()
    r = daemon.chat("HOOK-SLOW: hello")
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["blazar_code"] == "POLICY_HOOK_FAILED" and "'guard'" in error["message"]
    assert "500 ms" in error["message"]
    assert time.monotonic() - t0 < 2.0  # the hook answers after 2 s: it was not waited for

    r = daemon.messages("HOOK-SLOW: hello")
    assert r.status_code == 503 and r.json()["blazar_code"] == "POLICY_HOOK_FAILED"

    r = daemon.chat("PY-SLOW: hello")
    assert r.status_code == 200, r.text
    assert _policy(r)["py-guard"] == "failed_open"


def test_streams_are_held_for_a_buffering_hook_and_passed_by_the_others(daemon: Daemon) -> None:
    r = daemon.chat("REDACT-ANSWER: what is the capital of France?", stream=True)
    assert r.status_code == 200, r.text
    assert _sse_text(r) == REDACTED
    assert r.text.rstrip().endswith("data: [DONE]")
    said = _policy(r)
    assert said["audit"] == "redact" and said["py-audit"] == "skipped_stream"
    assert "policy_post_skipped" in r.headers["x-blazar-warnings"]
    post = next(p for p in reversed(daemon.hooks.seen) if p["stage"] == "post")
    assert post["stream"] is True

    # held whole, a refused answer is refused before anything is sent: a real 403
    r = daemon.chat("REFUSE-ANSWER: what is the capital of France?", stream=True)
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "POLICY_REFUSED"

    # the hook without buffer_streams does not see the stream: its redaction does not happen
    r = daemon.chat("PY-REDACT: what is the capital of France?", stream=True)
    assert r.status_code == 200
    assert _sse_text(r) not in ("", PY_REDACTED)
    assert _policy(r)["py-audit"] == "skipped_stream"

    # Anthropic's stream, held and redacted
    r = daemon.messages("REDACT-ANSWER: what is the capital of France?", stream=True)
    assert r.status_code == 200, r.text
    texts = [
        json.loads(line[6:])["delta"]["text"]
        for line in r.text.splitlines()
        if line.startswith("data: ") and '"text_delta"' in line
    ]
    assert "".join(texts) == REDACTED
    assert "event: message_stop" in r.text


def test_ollama_chat_and_generate_pass_the_same_hooks(daemon: Daemon) -> None:
    def chat(content: str, route: str = "/api/chat", **extra: Any) -> httpx.Response:
        body: dict[str, Any] = {
            "model": MODEL,
            "stream": False,
            "options": {"num_predict": 8, "temperature": 0},
        }
        if route == "/api/chat":
            body["messages"] = [{"role": "user", "content": content}]
        else:
            body["prompt"] = content
        return httpx.post(f"{daemon.url}{route}", json={**body, **extra}, headers=daemon.headers, timeout=120)

    r = chat("Please REFUSE-REQUEST now")
    assert r.status_code == 403
    assert r.json()["blazar_code"] == "POLICY_REFUSED" and "'guard'" in r.json()["error"]

    plain = chat(REWRITTEN_PROMPT)
    r = chat("My SECRET password is hunter2 and my card number is 4111 1111 1111 1111")
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == plain.json()["prompt_eval_count"]
    assert _policy(r) == {"guard": "rewrite", "py-guard": "allow", "audit": "allow"}

    r = chat("REDACT-ANSWER: what is the capital of France?")
    assert r.json()["message"]["content"] == REDACTED

    r = chat("REDACT-ANSWER: what is the capital of France?", stream=True)
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines() if line]
    assert "".join(line["message"]["content"] for line in lines) == REDACTED
    assert lines[-1]["done"] is True

    r = chat("REDACT-ANSWER: the capital of France is", route="/api/generate")
    assert r.status_code == 200, r.text
    assert r.json()["response"] == REDACTED


def _output_text(doc: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in doc["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def _audited(daemon: Daemon, trace_id: str) -> dict[str, Any]:
    audit = daemon.home / "logs" / "audit.jsonl"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if audit.exists():
            for line in audit.read_text().splitlines():
                if (doc := json.loads(line)).get("trace_id") == trace_id:
                    return dict(doc)
        time.sleep(0.1)
    raise AssertionError(f"no audit line for {trace_id}")


def test_responses_and_legacy_completions_pass_the_same_hooks(daemon: Daemon) -> None:
    """The official client: a refusal is its PermissionDeniedError; a rewrite is what runs (the
    prompt tokens of the rewritten prompt); a redaction is what the client, the stored Response
    (whole and streamed) and the audit log get."""
    sdk = daemon.sdk
    ask = {"model": MODEL, "max_output_tokens": 16, "temperature": 0}
    with pytest.raises(openai.PermissionDeniedError) as refused:
        sdk.responses.create(input="Please REFUSE-REQUEST now", **ask)
    assert refused.value.body["blazar_code"] == "POLICY_REFUSED"  # type: ignore[index]

    plain = sdk.responses.create(input=REWRITTEN_PROMPT, **ask)
    rewritten = sdk.responses.create(input="My SECRET is hunter2", **ask)
    assert rewritten.usage is not None and plain.usage is not None
    assert rewritten.usage.input_tokens == plain.usage.input_tokens

    whole = sdk.responses.create(input="REDACT-ANSWER: the capital of France?", **ask)
    assert whole.output_text == REDACTED
    assert sdk.responses.retrieve(whole.id).output_text == REDACTED  # stored as it was sent
    events = list(sdk.responses.create(input="REDACT-ANSWER: the capital of France?", stream=True, **ask))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.completed").response
    assert deltas == REDACTED and done.output_text == REDACTED
    assert sdk.responses.retrieve(done.id).output_text == REDACTED

    text = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    with pytest.raises(openai.PermissionDeniedError):
        sdk.completions.create(prompt="Please REFUSE-REQUEST now", **text)
    plain_c = sdk.completions.create(prompt=REWRITTEN_PROMPT, **text)
    raw = sdk.completions.with_raw_response.create(prompt="My SECRET is hunter2", **text)
    secret = raw.parse()
    assert secret.usage is not None and plain_c.usage is not None
    assert secret.usage.prompt_tokens == plain_c.usage.prompt_tokens
    assert secret.choices[0].text == plain_c.choices[0].text
    audited = _audited(daemon, raw.headers["x-blazar-trace-id"])
    assert "hunter2" not in json.dumps(audited) and REWRITTEN_PROMPT in audited["prompt"]
    redacted = sdk.completions.create(prompt="REDACT-ANSWER: the capital of France is", **text)
    assert redacted.choices[0].text == REDACTED
    streamed = sdk.completions.create(prompt="REDACT-ANSWER: the capital of France is", stream=True, **text)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == REDACTED

    # a stored chat completion keeps the rewritten messages, not the secret
    stored = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "My SECRET is hunter2"}], max_tokens=8, store=True
    )
    kept = sdk.chat.completions.messages.list(stored.id)
    assert [m.content for m in kept.data] == [REWRITTEN_PROMPT]


def test_batch_items_pass_the_hooks_of_their_route(daemon: Daemon) -> None:
    sdk = daemon.sdk
    lines = [
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8},
        }
        for cid, content in (("ok", "Say hi"), ("refused", "Please REFUSE-REQUEST now"))
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    upload = sdk.files.create(file=("in.jsonl", data), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (batch := sdk.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.2)
    assert batch.status == "completed" and batch.output_file_id and batch.error_file_id
    out = [json.loads(line) for line in sdk.files.content(batch.output_file_id).text.splitlines()]
    errors = [json.loads(line) for line in sdk.files.content(batch.error_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["ok"] and [e["custom_id"] for e in errors] == ["refused"]
    refused = errors[0]["response"]
    assert refused["status_code"] == 403 and refused["body"]["error"]["blazar_code"] == "POLICY_REFUSED"
