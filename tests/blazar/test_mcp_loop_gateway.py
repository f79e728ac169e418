"""The MCP tool loop through the real gateway, with the instant upstream as the engine and a
real MCP server (tests/mcp_servers/tools_server.py over stdio).

The upstream's ``--reply`` is an emulated call to an MCP tool, so while the tools are offered
the "model" calls it again each round: a request runs exactly ``max_rounds`` tool rounds and
its last round (offered no tools) answers with the reply as text. That makes the loop's
counts exact: rounds, calls, what each dialect shows of them while it streams, usage summed
over the rounds, what a key's scopes and the approval list let through, and a cancel that
reaches the running tool.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from actors.ledger import Flush
from blazar.auth.keys import KeyStore, keys_path
from blazar.config import Config
from tests.instant import MODEL, Gateway, instant_config, serve_gateway, sse_events

pytestmark = pytest.mark.slow

SERVER = Path(__file__).resolve().parent.parent / "mcp_servers" / "tools_server.py"
ASK = [{"role": "user", "content": "Say hi with the echo tool."}]
ECHO = {"tool": "mcp__local__echo", "arguments": {"text": "hi"}}


def _config(reply: dict[str, Any], **mcp: Any) -> Config:
    server = {"name": "local", "command": [sys.executable, str(SERVER)], "timeout_s": 20, "max_rounds": 2}
    doc = {"mcp_default": "all", "mcp": [{**server, **mcp}]}
    base = instant_config("--reply", json.dumps(reply))
    return msgspec.convert({**msgspec.to_builtins(base), **doc}, Config)


@asynccontextmanager
async def gateway(reply: dict[str, Any] = ECHO, **mcp: Any) -> AsyncIterator[Gateway]:
    async with serve_gateway(_config(reply, **mcp)) as gw:
        with trio.fail_after(90):
            yield gw


async def _why(gw: Gateway, trace_id: str) -> dict[str, Any]:
    """The request's story, once the gateway has recorded it (just after the reply's end)."""
    while True:
        await gw.runtime.ledger.ask(Flush())
        r = await gw.client.get(f"/api/why/{trace_id}")
        if r.status_code != 404:
            assert r.status_code == 200, r.text
            return dict(r.json())
        await trio.sleep(0.05)


async def test_openai_stream_passes_words_reports_calls_and_sums_usage(instant_home: Path) -> None:
    async with gateway() as gw:
        body = {"model": MODEL, "messages": ASK, "stream": True, "stream_options": {"include_usage": True}}
        r = await gw.client.post("/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-blazar-mcp"] == "servers=local"
        text = r.text
        assert text.count(": mcp calling mcp__local__echo") == 2
        assert text.count(": mcp called mcp__local__echo: ok") == 2
        assert ": x-blazar-mcp rounds=2, calls=2" in text
        chunks = [d for _, d in sse_events(r.content) if d != "[DONE]"]
        assert not any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert [
            c["choices"][0]["delta"]["role"]
            for c in chunks
            if c["choices"] and "role" in c["choices"][0]["delta"]
        ] == ["assistant"]
        said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert json.loads(said) == ECHO  # the last round, offered no tools, answers in words
        [finish] = [
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        ]
        assert finish == "stop"
        usage = chunks[-1]["usage"]
        whole = await gw.client.post("/v1/chat/completions", json={**body, "stream": False}, timeout=60)
        assert whole.headers["x-blazar-mcp"] == "rounds=2, calls=2"
        assert whole.json()["usage"] == usage  # the same three engine calls, summed
        story = await _why(gw, whole.headers["x-blazar-trace-id"])
        assert story["prompt_tokens"] == usage["prompt_tokens"]
        assert story["completion_tokens"] == usage["completion_tokens"]
        assert [(t["tool"], t["ok"]) for t in story["tools"]] == [("mcp__local__echo", True)] * 2
        assert any("MCP tool calls: mcp__local__echo (ok" in line for line in story["lines"])


async def test_anthropic_and_ollama_streams_run_the_same_loop(instant_home: Path) -> None:
    async with gateway() as gw:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 64, "stream": True}
        r = await gw.client.post("/v1/messages", json=body, timeout=60)
        assert r.status_code == 200, r.text
        events = sse_events(r.content)
        kinds = [name for name, _ in events]
        assert (
            kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds.count("message_start") == 1
        )
        blocks = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
        assert blocks and set(blocks) == {"text"}  # no tool_use of an MCP tool reaches the client
        [stop] = [d["delta"]["stop_reason"] for n, d in events if n == "message_delta"]
        assert stop == "end_turn" and ": x-blazar-mcp rounds=2, calls=2" in r.text

        r = await gw.client.post("/api/chat", json={"model": MODEL, "messages": ASK}, timeout=60)
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
        assert not any(line["message"].get("tool_calls") for line in lines)
        assert json.loads("".join(line["message"]["content"] for line in lines)) == ECHO


async def test_responses_show_each_call_as_an_mcp_call_item(instant_home: Path) -> None:
    async with gateway() as gw:
        body = {"model": MODEL, "input": "Say hi with the echo tool.", "stream": True}
        r = await gw.client.post("/v1/responses", json=body, timeout=60)
        events = sse_events(r.content)
        kinds = [n for n, _ in events]
        assert (
            kinds.count("response.mcp_call.in_progress") == 2
            and kinds.count("response.mcp_call.completed") == 2
        )
        assert kinds[-1] == "response.completed"
        seqs = [d["sequence_number"] for _, d in events]
        assert seqs == list(range(len(seqs)))
        done = events[-1][1]["response"]
        assert [i["type"] for i in done["output"]] == ["mcp_call", "mcp_call", "message"]
        call = done["output"][0]
        assert call["server_label"] == "local" and call["name"] == "echo" and call["status"] == "completed"
        assert json.loads(call["arguments"]) == {"text": "hi"} and call["output"] == "echo: hi"

        whole = await gw.client.post("/v1/responses", json={**body, "stream": False}, timeout=60)
        assert whole.headers["x-blazar-mcp"] == "rounds=2, calls=2"
        doc = whole.json()
        assert [i["type"] for i in doc["output"]] == ["mcp_call", "mcp_call", "message"]
        # the sampling that ran (llama.cpp's own defaults here), streamed or whole, as without MCP
        snapshots = [d["response"] for _, d in events if "response" in d]
        assert {(s["temperature"], s["top_p"]) for s in [*snapshots, doc]} == {(0.8, 0.95)}
        asked = {**body, "stream": False, "temperature": 0.3, "top_p": 0.6}
        chosen = (await gw.client.post("/v1/responses", json=asked, timeout=60)).json()
        assert (chosen["temperature"], chosen["top_p"]) == (0.3, 0.6)
        # a later turn continues after the calls: the stored mcp_call items are its history
        more = {"model": MODEL, "input": "again", "previous_response_id": doc["id"], "mcp": "none"}
        again = await gw.client.post("/v1/responses", json=more, timeout=60)
        assert again.status_code == 200, again.text


async def test_key_scopes_choose_among_the_servers(instant_home: Path) -> None:
    store = KeyStore(keys_path(instant_home))
    _, denied = store.add("no-local", mcp=("!local",))
    _, no_echo = store.add("no-echo", mcp=("!local/echo",))
    _, allowed = store.add("echo-only", mcp=("local/echo",))
    body = {"model": MODEL, "messages": ASK}
    async with gateway() as gw:
        named = await gw.client.post(
            "/v1/chat/completions",
            json={**body, "mcp": "local"},
            headers={"authorization": f"Bearer {denied}"},
        )
        assert named.status_code == 403 and named.json()["error"]["blazar_code"] == "MCP_SERVER_DENIED"
        by_default = await gw.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {denied}"}
        )
        assert (
            by_default.status_code == 200 and "x-blazar-mcp" not in by_default.headers
        )  # no server of its own
        # echo is not offered to this key: the model cannot call it and answers in words
        r = await gw.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {no_echo}"}, timeout=60
        )
        assert r.headers["x-blazar-mcp"] == "rounds=0, calls=0"
        r = await gw.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {allowed}"}, timeout=60
        )
        assert r.headers["x-blazar-mcp"] == "rounds=2, calls=2"


async def test_an_approval_list_refuses_a_call_unless_the_request_approves_it(instant_home: Path) -> None:
    async with gateway(approve=["ech*"]) as gw:
        body = {"model": MODEL, "input": "Say hi with the echo tool."}
        r = await gw.client.post("/v1/responses", json=body, timeout=60)
        calls = [i for i in r.json()["output"] if i["type"] == "mcp_call"]
        assert [c["status"] for c in calls] == ["failed", "failed"]
        assert (
            calls[0]["error"]["type"] == "mcp_protocol_error"
            and "needs approval" in calls[0]["error"]["message"]
        )
        story = await _why(gw, r.headers["x-blazar-trace-id"])
        assert [t["why"] for t in story["tools"]] == ["not_approved"] * 2
        ok = await gw.client.post(
            "/v1/responses", json=body, headers={"x-blazar-mcp-approve": "mcp__local__echo"}, timeout=60
        )
        assert [i.get("output") for i in ok.json()["output"] if i["type"] == "mcp_call"] == ["echo: hi"] * 2


async def test_a_request_cancelled_mid_loop_cancels_the_running_tool(
    instant_home: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "hang-cancelled"
    hang = {"tool": "mcp__local__hang", "arguments": {"marker": str(marker)}}
    async with gateway(hang, timeout_s=120) as gw:
        body = {"model": MODEL, "messages": ASK, "stream": True}
        async with gw.client.stream("POST", "/v1/chat/completions", json=body, timeout=60) as r:
            async for line in r.aiter_lines():
                if line.startswith(": mcp calling mcp__local__hang"):
                    break
            # another process writes the file: there is no event to wait on, only the file
            while not marker.exists():  # noqa: ASYNC110 - the tool runs now: the client goes away
                await trio.sleep(0.02)
        while marker.read_text() != "cancelled":  # noqa: ASYNC110
            await trio.sleep(0.05)
        assert marker.read_text() == "cancelled"
        # the server is still there for the next request
        r = await gw.client.post("/api/mcp/local/call", json={"tool": "echo", "arguments": {"text": "x"}})
        assert r.json()["text"] == "echo: x"


async def test_a_background_response_runs_the_loop_as_a_job(instant_home: Path) -> None:
    async with gateway(approve=["echo"]) as gw:
        body = {"model": MODEL, "input": "Say hi with the echo tool.", "background": True}
        r = await gw.client.post("/v1/responses", json=body, headers={"x-blazar-mcp-approve": "echo"})
        assert r.status_code == 200, r.text
        response_id = r.json()["id"]
        while True:  # polled as a client would
            doc = (await gw.client.get(f"/v1/responses/{response_id}")).json()
            if doc["status"] not in ("queued", "in_progress"):
                break
            await trio.sleep(0.05)
        assert doc["status"] == "completed", doc
        # the job kept the request's choice of servers and its approval
        assert [(i["type"], i.get("output")) for i in doc["output"]] == [
            ("mcp_call", "echo: hi"),
            ("mcp_call", "echo: hi"),
            ("message", None),
        ]


def test_a_job_queued_before_mcp_still_reads() -> None:
    from blazar.serve.jobs.background import _job_of

    old = _job_of(b"resp_1\nalice")
    assert (old.id, old.key, old.mcp) == ("resp_1", "alice", [])
    assert _job_of(b"resp_2").key is None
