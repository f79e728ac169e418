"""Golden files for the Ollama dialect.

Decoders: each ``golden/ollama/NAME.request.json`` has a ``NAME.expected.json``
holding the decoded neutral request, or the error code and message. The prefix
picks the decoder (``chat_``, ``generate_``, ``embed_``, ``legacy_``).

Encoders: each case in ``ENCODER_CASES`` renders bytes compared exactly with
``golden/ollama/encode_NAME.expected.ndjson``.

A missing golden answer fails its test; write or regenerate the answers after an
intended change with ``BLAZAR_REGEN_GOLDEN=1 pytest tests/blazar/test_ollama_dialect.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from blazar.dialects import ollama, ollama_embed, ollama_models, ollama_time
from blazar.dialects.neutral import (
    ChatRequest,
    ChatResponse,
    DecodeError,
    Delta,
    EmbedResponse,
    Message,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from tests.golden import assert_golden, assert_golden_json, decoded

GOLDEN = Path(__file__).parent / "golden" / "ollama"
CASES = sorted(p.name.removesuffix(".request.json") for p in GOLDEN.glob("*.request.json"))

T0 = "2024-07-22T20:31:34.071298917Z"
T1 = "2024-07-22T20:31:34.112233Z"
TIMINGS = ollama.Timings(
    total_ns=4_883_583_458, load_ns=1_334_875, prompt_eval_ns=342_546_000, eval_ns=4_535_599_000
)

DECODERS: dict[str, Callable[[bytes], object]] = {
    "chat": ollama.decode_chat_request,
    "generate": ollama.decode_generate_request,
    "embed": ollama.decode_embed_request,
    "legacy": ollama.decode_legacy_embeddings_request,
}


@pytest.mark.parametrize("name", CASES)
def test_decoder_golden(name: str) -> None:
    decoder = DECODERS[name.split("_", 1)[0]]
    got = decoded(decoder, (GOLDEN / f"{name}.request.json").read_bytes())
    assert_golden_json(GOLDEN / f"{name}.expected.json", got)


def test_every_case_has_a_golden_answer() -> None:
    assert len(CASES) >= 40
    assert all((GOLDEN / f"{c}.expected.json").exists() for c in CASES)


# --- decoder facts worth stating outright (the goldens hold the details) -------------------


def _chat(doc: dict[str, object]) -> ChatRequest:
    return ollama.decode_chat_request(msgspec.json.encode(doc))


def test_stream_defaults_to_true() -> None:
    assert _chat({"model": "m", "messages": []}).stream is True
    assert _chat({"model": "m", "messages": [], "stream": None}).stream is True
    assert _chat({"model": "m", "messages": [], "stream": False}).stream is False


def test_wrong_option_type_names_the_field() -> None:
    with pytest.raises(DecodeError, match=r"`options\.temperature`"):
        _chat({"model": "m", "messages": [], "options": {"temperature": "hot"}})
    with pytest.raises(DecodeError, match=r"`options\.num_ctx`"):
        _chat({"model": "m", "messages": [], "options": {"num_ctx": "4k"}})


def test_tools_with_format_require_a_tool() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    req = _chat({"model": "m", "messages": [], "tools": tools, "format": {"type": "object"}})
    assert req.tool_choice is not None and req.tool_choice.mode == "required"
    req = _chat({"model": "m", "messages": [], "tools": tools})
    assert req.tool_choice is not None and req.tool_choice.mode == "auto"
    assert _chat({"model": "m", "messages": []}).tool_choice is None


def test_tool_results_are_matched_to_calls() -> None:
    req = ollama.decode_chat_request((GOLDEN / "chat_tool_turn.request.json").read_bytes())
    calls = req.messages[1].tool_calls
    assert [c.id for c in calls] == ["call_0", "call_1"]
    assert msgspec.json.decode(calls[0].arguments) == {"city": "Paris", "unit": "celsius"}
    assert [(m.tool_call_id, m.tool_name) for m in req.messages[2:]] == [
        ("call_0", "get_weather"),
        ("call_1", "get_weather"),
    ]


def test_load_action() -> None:
    assert ollama.load_action(_chat({"model": "m", "messages": []})) == "load"
    assert ollama.load_action(_chat({"model": "m", "keep_alive": 0})) == "unload"
    assert ollama.load_action(_chat({"model": "m", "keep_alive": "0s"})) == "unload"
    assert ollama.load_action(_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]})) is None
    gen = ollama.decode_generate_request(b'{"model": "m", "prompt": "", "keep_alive": 0}')
    assert ollama.load_action(gen) == "unload"
    raw = ollama.decode_generate_request(b'{"model": "m", "prompt": "x", "raw": true}')
    assert ollama.load_action(raw) is None and raw.raw_prompt == "x"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("10s", 10.0),
        ("1.5h", 5400.0),
        ("2h45m30.5s", 9930.5),
        ("1m500ms", 60.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("+5m", 300.0),
        ("-1m", -1.0),
        ("-1", -1.0),
        ("0", 0.0),
        ("0s", 0.0),
        ("-0s", 0.0),
        ("300", 300.0),
        (" 30s ", 30.0),
        (0, 0.0),
        (0.0, 0.0),
        (-1, -1.0),
        (-0.5, -1.0),
        (300, 300.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration(value: str | int | float | None, seconds: float | None) -> None:
    got = ollama_time.parse_duration_s(value)
    if seconds is None:
        assert got is None
    else:
        assert got == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", ["5 minutes", "m", "5x", "1h 30m", "h1", "--1m", "5m-", ".s", "1e3", True, [5], float("nan")]
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(DecodeError, match="`keep_alive`"):
        ollama_time.parse_duration_s(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (134_515_008, "134.52M"),
        (494_032_768, "494.03M"),
        (7_241_732_096, "7.2B"),
        (8_030_261_248, "8.0B"),
        (3_212_749_888, "3.2B"),
        (70_553_706_496, "70.6B"),
        (8_000_000_000, "8B"),
        (22_000_000, "22M"),
        (999_999, "1000K"),
        (33_000, "33K"),
        (512, "512"),
    ],
)
def test_format_parameter_size(n: int, text: str) -> None:
    assert ollama_models.format_parameter_size(n) == text


def test_rfc3339() -> None:
    assert ollama_time.rfc3339_ns(1_721_680_294_071_298_917) == T0
    assert ollama_time.rfc3339_ns(1_721_680_294_000_000_000) == "2024-07-22T20:31:34Z"
    assert ollama_time.rfc3339_ns(1_721_680_294_100_000_000) == "2024-07-22T20:31:34.1Z"
    assert ollama_time.rfc3339(1_721_680_294.112233) == T1


def test_with_tag() -> None:
    assert ollama_models.with_tag("llama3.2") == "llama3.2:latest"
    assert ollama_models.with_tag("llama3.2:1b") == "llama3.2:1b"
    assert ollama_models.with_tag("hf.co/org/repo:Q4_K_M") == "hf.co/org/repo:Q4_K_M"
    assert ollama_models.with_tag("localhost:5000/org/repo") == "localhost:5000/org/repo:latest"


@pytest.mark.parametrize(
    ("status", "digest", "text"),
    [
        ("resolving", None, "pulling manifest"),
        ("downloading", "sha256:" + "ab" * 32, "pulling abababababab"),
        ("downloading", "cd" * 32, "pulling cdcdcdcdcdcd"),
        ("downloading", None, "pulling model"),
        ("verifying", None, "verifying sha256 digest"),
        ("importing", "sha256:" + "ab" * 32, "writing manifest"),
        ("success", None, "success"),
        ("trying next source", None, "trying next source"),
    ],
)
def test_pull_status(status: str, digest: str | None, text: str) -> None:
    assert ollama_models.pull_status(status, digest) == text


def test_model_capabilities() -> None:
    assert ollama_models.model_capabilities() == ["completion"]
    assert ollama_models.model_capabilities(tools=True, vision=True, thinking=True) == [
        "completion",
        "tools",
        "vision",
        "thinking",
    ]
    assert ollama_models.model_capabilities(embedding=True, tools=True) == ["embedding"]
    assert ollama_models.model_capabilities(rerank=True, tools=True, vision=True) == ["rerank"]


# --- tool-call accumulation ----------------------------------------------------------------


def test_tool_call_fragments_merge_by_index() -> None:
    acc = ollama.ToolCallAccumulator()
    assert not acc.pending
    acc.add([ToolCallDelta(index=0, id="call_a", name="get_weather", arguments='{"ci')])
    acc.add([ToolCallDelta(index=1, name="get_time", arguments="")])
    acc.add([ToolCallDelta(index=0, arguments='ty": "Paris"}'), ToolCallDelta(index=1, arguments='{"tz"')])
    acc.add([ToolCallDelta(index=1, arguments=': "CET"}')])
    assert acc.pending
    assert acc.finish() == [
        ToolCall(id="call_a", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_1", name="get_time", arguments='{"tz": "CET"}'),
    ]
    assert not acc.pending and acc.finish() == []


# --- encoder goldens -----------------------------------------------------------------------

USAGE = Usage(prompt_tokens=26, completion_tokens=282)
DETAILS = ollama_models.ModelDetails(
    family="llama",
    families=["llama"],
    parameter_size=ollama_models.format_parameter_size(134_515_008),
    quantization_level="Q4_1",
)


def _chat_stream() -> bytes:
    """Text, thinking and two fragmented tool calls, as the gateway will drive it."""
    enc = ollama.StreamEncoder("qwen3:latest", dialect="chat")
    deltas = [
        Delta(thinking="Let me check"),
        Delta(thinking=" the weather."),
        Delta(text="Checking"),
        Delta(tool_calls=[ToolCallDelta(index=0, id="call_x", name="get_weather", arguments='{"city"')]),
        Delta(tool_calls=[ToolCallDelta(index=0, arguments=': "Paris"}')]),
        Delta(tool_calls=[ToolCallDelta(index=1, name="get_time", arguments='{"tz": "CET"}')]),
        Delta(finish_reason="tool_calls"),
        Delta(usage=USAGE),
    ]
    out = b"".join(enc.feed(d, created_at=T0) for d in deltas)
    return out + enc.finish(created_at=T1, timings=TIMINGS)


def _chat_stream_think_off() -> bytes:
    enc = ollama.StreamEncoder("m", dialect="chat", think=False)
    out = enc.feed(Delta(thinking="hidden"), created_at=T0) + enc.feed(Delta(text="Hi"), created_at=T0)
    out += enc.feed(
        Delta(finish_reason="length", usage=Usage(prompt_tokens=3, completion_tokens=1)), created_at=T0
    )
    return out + enc.finish(created_at=T1, timings=ollama.Timings(total_ns=5, prompt_eval_ns=2, eval_ns=3))


def _chat_functions() -> bytes:
    return (
        ollama.encode_chat_chunk("llama3.2", Delta(text="The"), created_at=T0)
        + ollama.encode_chat_chunk("llama3.2", Delta(text=" sky", thinking="hmm"), created_at=T0)
        + ollama.encode_chat_final(
            "llama3.2", created_at=T1, finish_reason="stop", usage=USAGE, timings=TIMINGS
        )
    )


def _generate_stream() -> bytes:
    enc = ollama.StreamEncoder("llama3.2", dialect="generate")
    out = b"".join(
        enc.feed(d, created_at=T0)
        for d in (
            Delta(thinking="Think."),
            Delta(text="The"),
            Delta(text=" sky"),
            Delta(finish_reason="stop", usage=USAGE),
        )
    )
    return out + enc.finish(created_at=T1, timings=TIMINGS)


def _responses() -> bytes:
    resp = ChatResponse(
        id="chatcmpl-1",
        model="engine-name",
        created=0,
        text="",
        thinking="I will call it.",
        tool_calls=[
            ToolCall(id="call_0", name="get_weather", arguments='{"city": "Paris", "days": 2}'),
            ToolCall(id="call_1", name="broken", arguments="not json"),
        ],
        finish_reason="tool_calls",
        usage=USAGE,
    )
    text = ChatResponse(
        id="x", model="llama3.2", created=0, text="Blue.", finish_reason="length", usage=USAGE
    )
    return (
        ollama.encode_chat_response(resp, created_at=T1, timings=TIMINGS, model="qwen3:latest")
        + ollama.encode_chat_response(resp, created_at=T1, timings=TIMINGS, think=False, model="qwen3")
        + ollama.encode_generate_response(text, created_at=T1, timings=TIMINGS)
        + ollama.encode_generate_final(
            "llama3.2",
            created_at=T1,
            finish_reason=None,
            usage=None,
            timings=ollama.Timings(),
        )
    )


def _load() -> bytes:
    return b"".join(
        ollama.encode_load_response("llama3.2", created_at=T1, done_reason=reason, dialect=dialect)
        for dialect in ("chat", "generate")
        for reason in ("load", "unload")
    )


def _tags() -> bytes:
    return ollama_models.encode_tags(
        [
            ollama_models.TagEntry(
                name="smollm",
                size=91_739_413,
                digest="sha256:" + "0123456789abcdef" * 4,
                modified_at=1_721_680_294.5,
                details=DETAILS,
                engine="llamacpp",
            ),
            ollama_models.TagEntry(
                name="nomic-embed-text:v1.5",
                size=274_302_450,
                digest="fedcba9876543210" * 4,
                modified_at=1_700_000_000.0,
                details=ollama_models.ModelDetails(
                    family="nomic-bert",
                    families=["nomic-bert"],
                    parameter_size="137M",
                    quantization_level="F16",
                ),
                capabilities=["embedding"],
            ),
        ]
    )


def _ps() -> bytes:
    return ollama_models.encode_ps(
        [
            ollama_models.PsEntry(
                name="smollm",
                size=150_000_000,
                digest="sha256:" + "0123456789abcdef" * 4,
                details=DETAILS,
                expires_at=1_721_680_594.25,
                context_length=4096,
                engine="llamacpp",
                slots=2,
                in_flight=1,
                extras={"blazar_sleeping": False},
            ),
            ollama_models.PsEntry(
                name="big:70b",
                size=42_000_000_000,
                digest="ab" * 32,
                expires_at=None,
                size_vram=41_000_000_000,
                context_length=8192,
                engine="llamacpp",
                slots=1,
            ),
        ]
    )


def _show() -> bytes:
    return ollama_models.encode_show(
        modelfile="FROM smollm\n",
        parameters='stop                           "<|im_end|>"',
        template="{{ .Prompt }}",
        system="You are helpful.",
        details=DETAILS,
        model_info={
            "general.architecture": "llama",
            "general.parameter_count": 134_515_008,
            "llama.context_length": 2048,
            "llama.embedding_length": 576,
        },
        capabilities=ollama_models.model_capabilities(tools=True),
        modified_at=1_721_680_294.5,
        extras={"engine": "llamacpp"},
    )


def _misc() -> bytes:
    return (
        ollama_embed.encode_embed_response(
            EmbedResponse(model="all-minilm", embeddings=[[0.5, -0.25], [1.0, 0.0]], prompt_tokens=8),
            total_ns=14_143_917,
            load_ns=1_019_500,
        )
        + ollama_embed.encode_embed_response(
            EmbedResponse(model="x", embeddings=[]), total_ns=0, load_ns=0, model="all-minilm"
        )
        + ollama_embed.encode_legacy_embedding([0.5, -0.25])
        + ollama_embed.encode_legacy_embedding([])
        + ollama_models.encode_version("0.1.0")
        + ollama.encode_error("MODEL_NOT_FOUND", "model 'x' is not installed — run `blazar pull x`")
    )


def _pull() -> bytes:
    digest = "sha256:" + "ab" * 32
    return (
        ollama_models.encode_pull_progress(ollama_models.pull_status("resolving", None))
        + ollama_models.encode_pull_progress(
            ollama_models.pull_status("downloading", digest), digest=digest, total=1000, completed=0
        )
        + ollama_models.encode_pull_progress(
            ollama_models.pull_status("downloading", digest), digest=digest, total=1000, completed=1000
        )
        + ollama_models.encode_pull_progress(ollama_models.pull_status("verifying", digest))
        + ollama_models.encode_pull_progress(ollama_models.pull_status("importing", digest))
        + ollama_models.encode_pull_progress(ollama_models.pull_status("success", digest))
    )


ENCODER_CASES: dict[str, Callable[[], bytes]] = {
    "chat_stream": _chat_stream,
    "chat_stream_think_off": _chat_stream_think_off,
    "chat_functions": _chat_functions,
    "generate_stream": _generate_stream,
    "responses": _responses,
    "load": _load,
    "tags": _tags,
    "ps": _ps,
    "show": _show,
    "misc": _misc,
    "pull": _pull,
}


@pytest.mark.parametrize("name", sorted(ENCODER_CASES))
def test_encoder_golden(name: str) -> None:
    got = ENCODER_CASES[name]()
    assert got.endswith(b"\n")
    for line in got.splitlines():
        assert isinstance(msgspec.json.decode(line), dict)
    assert_golden(GOLDEN / f"encode_{name}.expected.ndjson", got)


def test_stream_sends_tool_calls_whole_then_done() -> None:
    lines = [msgspec.json.decode(x) for x in _chat_stream().splitlines()]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    calls = lines[-2]["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"tz": "CET"}]
    assert lines[-1]["done_reason"] == "stop"
    assert lines[-1]["eval_count"] == 282 and lines[-1]["eval_duration"] == 4_535_599_000


def test_stream_error_is_one_final_line() -> None:
    line = ollama.encode_error("ENGINE_CRASHED", "the engine stopped")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert msgspec.json.decode(line) == {"error": "the engine stopped", "blazar_code": "ENGINE_CRASHED"}


def test_messages_keep_thinking_and_images() -> None:
    req = _chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "x", "images": ["AAAA"]},
                {"role": "assistant", "content": "y", "thinking": "t"},
            ],
        }
    )
    assert req.messages == [
        Message(role="user", content="x", images=["AAAA"]),
        Message(role="assistant", content="y", thinking="t"),
    ]
