"""The blocking client against a real daemon and the real SmolLM2 engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.support import MODEL, DaemonProc, add_key, ensure_model, make_home, start_daemon, wait_until

from blazar_sdk import AsyncClient, BlazarError, ChatCompletion, Client, PullProgress

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello in one short sentence."}]


@pytest.fixture(scope="module")
def client(sdk_daemon: DaemonProc) -> Client:
    return Client(base_url=sdk_daemon.url)


def test_env_defaults_name_the_daemon(sdk_daemon: DaemonProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZAR_URL", sdk_daemon.url + "/v1")
    monkeypatch.delenv("BLAZAR_API_KEY", raising=False)
    c = Client()
    assert c.base_url == sdk_daemon.url and c.api_key is None
    assert MODEL in [m.id for m in c.models()]
    monkeypatch.delenv("BLAZAR_URL")
    assert Client().base_url == "http://127.0.0.1:11435"


def test_chat_whole_then_ps_explain_and_why(client: Client) -> None:
    answer = client.chat(MODEL, HI, max_tokens=16, temperature=0)
    assert isinstance(answer, ChatCompletion)
    assert answer.text.strip() and answer.choices[0].finish_reason in ("stop", "length")
    assert (
        answer.usage is not None and answer.usage.completion_tokens and answer.usage.completion_tokens <= 16
    )
    assert answer.meta.trace_id and answer.meta.trace_id.startswith("blz-")

    running = {m.name: m for m in client.ps()}
    assert f"{MODEL}:latest" in running
    assert running[f"{MODEL}:latest"].context_length and running[f"{MODEL}:latest"].slots

    explained = client.explain(MODEL)
    assert explained.model == MODEL and explained.loaded
    assert explained["ctx_total"].value == explained["ctx_per_slot"].value * explained["slots"].value
    assert explained["ctx_total"].source == "derived"

    story = client.why(answer.meta.trace_id)
    assert story.trace_id == answer.meta.trace_id and story.outcome == "ok" and story.lines


def test_chat_stream_yields_text_and_ends_with_done(client: Client) -> None:
    with client.chat(MODEL, HI, stream=True, max_tokens=16, temperature=0) as stream:
        chunks = list(stream)
    assert stream.meta.status == 200 and stream.meta.trace_id
    text = "".join(c.text for c in chunks)
    assert text.strip()
    assert chunks[-1].finish_reason in ("stop", "length") or any(c.finish_reason for c in chunks)


def test_cancel_ends_a_running_stream_with_the_daemon_code(client: Client) -> None:
    stream = client.chat(
        MODEL,
        [{"role": "user", "content": "Count from one to one thousand, in words."}],
        stream=True,
        max_tokens=2000,
    )
    trace_id = stream.meta.trace_id
    assert trace_id
    items = iter(stream)
    next(items)  # the stream has started
    assert client.cancel(trace_id) is True
    with pytest.raises(BlazarError) as caught:
        for _ in items:
            pass
    err = caught.value
    assert err.status is None  # an error event inside a 200 stream
    assert not err.blazar_code.startswith("SDK_"), err
    assert err.trace_id == trace_id
    card = wait_until(lambda: [c for c in client.requests() if c.id == trace_id and c.state == "cancelled"])
    assert card
    assert client.cancel(trace_id) is False  # it has ended


def test_tools_mcp_and_best_of_reach_the_daemon(client: Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    forced = client.chat(
        MODEL,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=64,
    )
    assert forced.tool_calls and forced.tool_calls[0].name == "get_weather"
    assert isinstance(forced.tool_calls[0].parsed(), dict)

    best = client.chat(MODEL, HI, best_of=2, max_tokens=8)
    assert best.meta.headers["x-blazar-best-of"].startswith("ran=2")

    with pytest.raises(BlazarError) as caught:
        client.chat(MODEL, HI, mcp="no-such-server", max_tokens=8)
    assert caught.value.blazar_code == "MCP_SERVER_NOT_FOUND" and caught.value.status == 404


def test_errors_carry_code_status_and_message_in_each_dialect(client: Client) -> None:
    with pytest.raises(BlazarError) as openai_err:
        client.chat("no-such-model", HI)
    assert (openai_err.value.status, openai_err.value.blazar_code) == (404, "MODEL_NOT_FOUND")
    assert "blazar pull" in openai_err.value.message and openai_err.value.trace_id

    with pytest.raises(BlazarError) as param_err:
        client.chat(MODEL, HI, top_p=1.5)
    assert (param_err.value.status, param_err.value.blazar_code, param_err.value.param) == (
        400,
        "BAD_REQUEST",
        "top_p",
    )

    with pytest.raises(BlazarError) as ollama_err:  # /api/*: Ollama's {"error": "…"} envelope
        client.explain("no-such-model")
    assert (ollama_err.value.status, ollama_err.value.blazar_code) == (404, "MODEL_NOT_FOUND")

    with pytest.raises(BlazarError) as anthropic_err:  # /v1/messages/*: Anthropic's envelope
        client.message_batches.get("msgbatch_nope")
    assert anthropic_err.value.status == 404 and anthropic_err.value.blazar_code == "NOT_FOUND"
    assert anthropic_err.value.type == "not_found_error"

    with pytest.raises(BlazarError) as gone:
        Client(base_url="http://127.0.0.1:9", timeout=5).models()
    assert gone.value.blazar_code == "SDK_CONNECTION" and gone.value.status is None


def test_responses_whole_stream_and_background_job(client: Client) -> None:
    whole = client.responses(MODEL, "Say hello.", max_output_tokens=16)
    assert whole.status in ("completed", "incomplete") and whole.output_text.strip()
    assert client.get_response(whole.id).output_text == whole.output_text

    with client.responses(MODEL, "Say hello.", stream=True, max_output_tokens=16) as events:
        got = list(events)
    assert got[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in got if e.type == "response.output_text.delta").strip()

    background = client.responses(MODEL, "Say hello.", background=True, max_output_tokens=16)
    job = client.jobs.wait(background.id, timeout_s=120)
    assert job.kind == "response" and job.status == "completed"
    assert job.id in [j.id for j in client.jobs.list(kind="response").data]
    assert client.get_response(background.id).output_text.strip()
    with pytest.raises(BlazarError) as no_result:  # a response's answer is the response itself
        client.jobs.result(job.id)
    assert (no_result.value.status, no_result.value.blazar_code) == (409, "JOB_NO_RESULT")
    with pytest.raises(BlazarError) as finished:
        client.jobs.cancel(job.id)
    assert finished.value.blazar_code == "JOB_FINISHED"


def test_embed_gives_one_unit_vector_per_input(client: Client) -> None:
    got = client.embed(MODEL, ["a cat", "a dog"], dimensions=16)
    assert len(got.vectors) == 2 and all(len(v) == 16 for v in got.vectors)
    assert abs(sum(x * x for x in got.vectors[0]) - 1.0) < 1e-3
    assert got.usage is not None and got.usage.prompt_tokens


def test_openai_and_anthropic_batches(client: Client) -> None:
    batch = client.batches.create(
        [
            {"custom_id": "a", "body": {"model": MODEL, "messages": HI, "max_tokens": 8}},
            {"custom_id": "b", "body": {"model": MODEL, "messages": HI, "max_tokens": 8}},
        ]
    )
    assert batch["status"] in ("validating", "in_progress")
    done = client.batches.wait(batch["id"], timeout_s=180)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 2
    lines = client.batches.results(batch["id"])
    assert [line["custom_id"] for line in lines] == ["a", "b"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert batch["id"] in [b["id"] for b in client.batches.list()]

    params = {"model": MODEL, "max_tokens": 8, "messages": HI}
    mb = client.message_batches.create([{"custom_id": "x", "params": params}])
    assert mb["type"] == "message_batch"
    ended = client.message_batches.wait(mb["id"], timeout_s=180)
    assert ended["request_counts"]["succeeded"] == 1
    results = client.message_batches.results(mb["id"])
    assert results[0]["custom_id"] == "x" and results[0]["result"]["type"] == "succeeded"
    assert client.message_batches.delete(mb["id"])["type"] == "message_batch_deleted"


def test_failover_list_pin_unpin(client: Client) -> None:
    (chain,) = [c for c in client.failover.list() if c.name == "tiny"]
    assert [t.target for t in chain.targets] == ["not-installed-model", MODEL] and chain.pinned is None
    served = client.chat("tiny", HI, max_tokens=4)
    assert served.meta.headers["x-blazar-target"] == MODEL

    assert client.failover.pin("tiny", MODEL)["pinned"] == MODEL
    assert [c.pinned for c in client.failover.list() if c.name == "tiny"] == [MODEL]
    assert client.failover.unpin("tiny")["was"] == MODEL
    with pytest.raises(BlazarError) as unknown:
        client.failover.pin("no-chain", MODEL)
    assert unknown.value.blazar_code == "FAILOVER_CHAIN_NOT_FOUND"


def test_pull_reports_progress_then_success(client: Client) -> None:
    seen: list[PullProgress] = []
    last = client.pull(MODEL, progress=seen.append)
    assert last.status == "success" and seen and seen[-1] is last
    pulls = client.jobs.list(kind="pull").data
    assert pulls and pulls[0].status == "completed"
    assert client.jobs.result(pulls[0].id).text.strip() == MODEL

    with pytest.raises(BlazarError) as unknown:
        client.pull("no-such-org/no-such-model-xyz")
    assert unknown.value.blazar_code in ("MODEL_NOT_FOUND", "BAD_GATEWAY")


def test_api_key_is_sent_and_refusals_are_typed(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", ensure_model())
    secret = add_key(home, "sdk")
    d = start_daemon(home)
    try:
        assert MODEL in [m.id for m in Client(base_url=d.url, api_key=secret).models()]
        with pytest.raises(BlazarError) as refused:
            Client(base_url=d.url, api_key="wrong").models()
        assert (refused.value.status, refused.value.blazar_code) == (401, "UNAUTHORIZED")
    finally:
        d.stop()


def test_raw_keeps_fields_the_types_do_not_model(client: Client) -> None:
    (model,) = [m for m in client.models() if m.id == MODEL]
    assert json.loads(json.dumps(model.raw))["object"] == "model"


def test_a_daemon_killed_mid_stream_is_a_cut_stream_in_both_clients(tmp_path: Path) -> None:
    d = start_daemon(make_home(tmp_path / "home", ensure_model()))
    long = [{"role": "user", "content": "Count from one to one thousand, in words."}]

    async def main() -> None:
        aclient = AsyncClient(base_url=d.url)
        astream = await aclient.chat(MODEL, long, stream=True, max_tokens=2000)
        aitems = astream.__aiter__()
        await aitems.__anext__()
        sync_items = iter(Client(base_url=d.url).chat(MODEL, long, stream=True, max_tokens=2000))
        next(sync_items)
        d.proc.kill()  # SIGKILL: the connections end without the chunked body's last chunk
        d.proc.wait()
        with pytest.raises(BlazarError) as sync_cut:
            for _ in sync_items:
                pass
        assert sync_cut.value.blazar_code == "SDK_STREAM_CUT"
        with pytest.raises(BlazarError) as async_cut:
            async for _ in aitems:
                pass
        assert async_cut.value.blazar_code == "SDK_STREAM_CUT"

    try:
        asyncio.run(main())
    finally:
        d.stop()
