"""The mistral.rs lane's launch data and its host's request mapping (no wheel, no engine)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import msgspec
import pytest

from actors.engines import mistralrs_api as api
from actors.engines.mistralrs import (
    Binary,
    LaunchSpec,
    build_argv,
    find_mistralrs,
    lane_info,
    launch_env,
    max_seqs_for,
)
from actors.engines.mistralrs_host import parse_args, prepare_env, runner_kwargs


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {"model": "smollm2-135m", "path": "/m/blobs/sha256-ab", "ctx_per_slot": 4096}
    return LaunchSpec(**{**base, "slots": 4, **kw})  # type: ignore[arg-type]


def test_host_argv() -> None:
    argv = build_argv(spec(threads=2, chat_template="/t.jinja"), port=1234, api_key="k", binary=None)
    assert argv == [
        sys.executable, "-m", "actors.engines.mistralrs_host",
        "-m", "/m/blobs/sha256-ab",
        "--host", "127.0.0.1",
        "--port", "1234",
        "--api-key", "k",
        "--alias", "smollm2-135m",
        "--max-seqs", "1",  # four slots asked, one sequence at a time on the CPU
        "-t", "2",
        "--chat-template", "/t.jinja",
    ]  # fmt: skip


def test_serve_binary_argv() -> None:
    binary = Binary(path="/opt/mistralrs", style="serve")
    argv = build_argv(spec(), port=9, api_key="k", binary=binary)
    assert argv == [
        sys.executable, "-m", "actors.engines.watchdog", "/opt/mistralrs",
        "--token-source", "none",
        "serve",
        "--host", "127.0.0.1",
        "-p", "9",
        "--no-ui",
        "--disable-access-log",
        "--max-seqs", "1",
        "--max-seq-len", "4096",
        "--max-batch-size", "1",
        "--format", "gguf",
        "-m", "/m/blobs",
        "-f", "sha256-ab",
        "--cpu",
    ]  # fmt: skip
    gpu = build_argv(spec(gpu_layers=99), port=9, api_key="k", binary=binary)
    assert "--cpu" not in gpu and gpu[gpu.index("--max-seqs") + 1] == "4"


def test_legacy_server_argv() -> None:
    binary = Binary(path="/opt/mistralrs-server", style="server")
    argv = build_argv(spec(chat_template="/t.jinja"), port=9, api_key="k", binary=binary)
    assert argv == [
        sys.executable, "-m", "actors.engines.watchdog", "/opt/mistralrs-server",
        "--serve-ip", "127.0.0.1",
        "-p", "9",
        "--token-source", "none",
        "--max-seqs", "1",
        "-j", "/t.jinja",
        "gguf",
        "-m", "/m/blobs",
        "-f", "sha256-ab",
    ]  # fmt: skip


def test_max_seqs_and_env() -> None:
    assert max_seqs_for(spec()) == 1 and max_seqs_for(spec(gpu_layers=10)) == 4
    assert max_seqs_for(spec(slots=1, gpu_layers=0)) == 1
    assert launch_env(spec(threads=3)) == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAYON_NUM_THREADS": "3",
    }


def _executable(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_find_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_mistralrs(None) is None
    legacy = _executable(tmp_path, "mistralrs-server")
    assert find_mistralrs(None) == Binary(path=str(legacy), style="server")
    cli = _executable(tmp_path, "mistralrs")
    assert find_mistralrs(None) == Binary(path=str(cli), style="serve")  # the current CLI first
    assert find_mistralrs("/x/mistralrs-server") == Binary(path="/x/mistralrs-server", style="server")
    assert find_mistralrs("/x/mrs") == Binary(path="/x/mrs", style="serve")


def test_lane_info() -> None:
    host = lane_info(None)
    assert host.lane == "mistralrs-host" and host.checks_api_key and host.props
    assert {"chat", "completions", "json_schema"} == set(host.capabilities) and host.formats == ("gguf",)
    assert not host.streams_completions
    binary = lane_info(Binary(path="/b", style="serve"))
    assert binary.lane == "mistralrs-serve" and not binary.checks_api_key and binary.streams_completions


def test_the_host_reads_the_argv_the_lane_builds() -> None:
    argv = build_argv(spec(threads=2), port=1234, api_key="k", binary=None)
    ns = parse_args(argv[3:])
    which, runner = runner_kwargs(ns)
    assert which == {"quantized_model_id": "/m/blobs", "quantized_filename": "sha256-ab"}
    assert runner == {"token_source": "none", "max_seqs": 1}
    assert (ns.port, ns.api_key, ns.alias, ns.threads) == (1234, "k", "smollm2-135m", 2)
    env: dict[str, str] = {"RUST_LOG": "debug"}
    prepare_env(ns, env)
    assert env["HF_HUB_OFFLINE"] == "1" and env["RAYON_NUM_THREADS"] == "2"
    assert env["RUST_LOG"] == "debug"  # a caller's choice stays
    ns = parse_args(["-m", "x.gguf", "-s", "7", "--chat-template", "/t.jinja"])
    assert runner_kwargs(ns)[1] == {
        "token_source": "none",
        "max_seqs": 1,
        "seed": 7,
        "jinja_explicit": "/t.jinja",
    }
    env = {}
    prepare_env(ns, env)
    assert env["RUST_LOG"] == "warn" and "RAYON_NUM_THREADS" not in env


# -- request mapping ---------------------------------------------------------


def chat(**body: object) -> dict[str, object]:
    return api.chat_options(
        api.decode_chat(msgspec.json.encode({"messages": [{"role": "user", "content": "hi"}], **body}))
    )


def completion(**body: object) -> dict[str, object]:
    return api.completion_options(api.decode_completion(msgspec.json.encode({"prompt": "once", **body})))


def test_chat_maps_sampling_and_messages() -> None:
    opts = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ],
        max_tokens=8,
        max_completion_tokens=5,
        temperature=0,
        top_p=0.9,
        stop="\n",
        seed=3,  # greedy: the seed changes nothing, so it is accepted
        logit_bias={"42": -100},
    )
    assert opts == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "ab"},
            {"role": "assistant", "content": ""},
        ],
        "max_tokens": 5,
        "temperature": 0.0,
        "top_p": 0.9,
        "stop_seqs": ["\n"],
        "logit_bias": {42: -100.0},
    }
    assert "max_tokens" not in chat()  # chat has no default cap


def test_json_output_becomes_a_grammar() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    opts = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert opts["grammar_type"] == "json_schema" and msgspec.json.decode(opts["grammar"]) == schema  # type: ignore[arg-type]
    assert msgspec.json.decode(chat(response_format={"type": "json_object"})["grammar"]) == {"type": "object"}  # type: ignore[arg-type]
    assert "grammar" not in chat(response_format={"type": "text"})
    with pytest.raises(api.RequestError):
        chat(response_format={"type": "json_schema"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"seed": 1, "temperature": 0.7}, "seed"),
        ({"seed": 1}, "seed"),  # no temperature: the engine samples
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ],
)
def test_chat_refuses_what_the_engine_cannot_do(body: dict[str, object], param: str) -> None:
    with pytest.raises(api.RequestError) as info:
        chat(**body)
    assert info.value.param == param and info.value.code == "unsupported_parameter"
    assert param.split("[")[0] in info.value.message


def test_chat_ignores_tools_it_is_told_not_to_call() -> None:
    assert "tools" not in chat(tools=[{"type": "function"}], tool_choice="none")


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"messages": "hi"}', b'{"messages": []}', b'{"messages": [{"role": "robot", "content": "x"}]}'],
)
def test_bad_chat_bodies_are_400s(body: bytes) -> None:
    with pytest.raises(api.RequestError):
        api.chat_options(api.decode_chat(body))


def test_completion_mapping() -> None:
    assert completion() == {"prompt": "once", "max_tokens": api.COMPLETION_MAX_TOKENS}
    opts = completion(prompt=["upon"], max_tokens=4, echo=True, stop=["a", ""], temperature=0.5)
    assert opts == {
        "prompt": "upon",
        "max_tokens": 4,
        "echo_prompt": True,
        "stop_seqs": ["a"],
        "temperature": 0.5,
    }
    refused = [
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"n": 3}, "n"),
    ]
    for body, param in refused:
        with pytest.raises(api.RequestError) as info:
            completion(**body)
        assert info.value.param == param
    with pytest.raises(api.RequestError):
        completion(max_tokens=0)


def test_response_shapes() -> None:
    class Usage:
        prompt_tokens, completion_tokens, total_tokens = 3, 2, 5
        total_prompt_time_sec, total_completion_time_sec = 0.0, 0.0

    whole = api.chat_response_json(rid="c1", model="m", content="hey", finish="canceled", usage=Usage())
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "hey"}
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["usage"]["total_tokens"] == 5
    usage_chunk = api.chat_chunk_json(rid="c1", model="m", created=1, usage=Usage())
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["prompt_tokens"] == 3
    text = api.completion_response_json(rid="x", model="m", text="t", finish="length", usage=None)
    assert text["choices"][0]["finish_reason"] == "length" and "usage" not in text
    assert api.new_id("cmpl").startswith("cmpl-")


def test_llama_cpp_extensions_the_gateway_relays() -> None:
    grammar = '%llguidance {}\nstart: %json {"type": "object"}'
    opts = chat(
        repeat_penalty=1.1, grammar=grammar, ignore_eos=True, cache_prompt=True, id_slot=0, dry_multiplier=0.8
    )
    assert opts["repetition_penalty"] == 1.1 and opts["ignore_eos"] is True and opts["dry_multiplier"] == 0.8
    assert (opts["grammar"], opts["grammar_type"]) == (grammar, "lark")
    assert "cache_prompt" not in opts and "id_slot" not in opts
    opts = completion(json_schema={"type": "array"})
    assert opts["grammar_type"] == "json_schema" and msgspec.json.decode(opts["grammar"]) == {"type": "array"}  # type: ignore[arg-type]
    assert "ignore_eos" not in completion(mirostat=0)  # off: nothing to refuse


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"mirostat": 2}, "mirostat"),
        ({"xtc_probability": 0.5}, "xtc_probability"),
        ({"n_probs": 3}, "n_probs"),
        ({"samplers": ["top_k"]}, "samplers"),
        ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs"),
    ],
)
def test_llama_cpp_samplers_the_engine_lacks_are_refused(body: dict[str, object], param: str) -> None:
    with pytest.raises(api.RequestError) as info:
        chat(**body)
    assert info.value.param == param


def test_one_constraint_at_a_time() -> None:
    with pytest.raises(api.RequestError):
        chat(grammar="start: /a/", response_format={"type": "json_object"})
    with pytest.raises(api.RequestError):
        completion(grammar="start: /a/", json_schema={"type": "object"})


def test_timings_in_llama_server_shape() -> None:
    class Usage:
        prompt_tokens, completion_tokens, total_tokens = 30, 8, 38
        total_prompt_time_sec, total_completion_time_sec = 1.5, 0.4

    assert api.timings_json(Usage()) == {
        "prompt_n": 30,
        "prompt_ms": 1500.0,
        "predicted_n": 8,
        "predicted_ms": 400.0,
        "prompt_per_second": 20.0,
        "predicted_per_second": 20.0,
    }
