"""Golden files for the OpenAI dialect decoder.

Each ``golden/openai/NAME.request.json`` has a ``NAME.expected.json``: the
decoded neutral request, or the error code and message. Regenerate after an
intended change with ``BLAZAR_REGEN_GOLDEN=1 pytest tests/blazar/test_openai_dialect.py``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from blazar.dialects import openai
from tests.golden import assert_golden_json, decoded

GOLDEN = Path(__file__).parent / "golden" / "openai"
CASES = sorted(p.name.removesuffix(".request.json") for p in GOLDEN.glob("*.request.json"))


@pytest.mark.parametrize("name", CASES)
def test_golden(name: str) -> None:
    decoder = (
        openai.decode_completion_request if name.startswith("completion") else openai.decode_chat_request
    )
    got = decoded(decoder, (GOLDEN / f"{name}.request.json").read_bytes())
    assert_golden_json(GOLDEN / f"{name}.expected.json", got)


def test_every_case_has_a_golden_answer() -> None:
    assert len(CASES) >= 10
    assert all((GOLDEN / f"{c}.expected.json").exists() for c in CASES)


def test_stream_error_event_is_final_sse_event() -> None:
    event = openai.encode_stream_error("ENGINE_CRASHED", "boom")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    doc = msgspec.json.decode(event[6:])
    assert doc["error"]["blazar_code"] == "ENGINE_CRASHED"


def test_merge_error_code_keeps_engine_body() -> None:
    body = b'{"error":{"code":400,"message":"context too long","type":"exceed_context_size_error"}}'
    doc = msgspec.json.decode(openai.merge_error_code(body, "BAD_REQUEST"))
    assert doc["error"]["message"] == "context too long"
    assert doc["error"]["blazar_code"] == "BAD_REQUEST"
    plain = msgspec.json.decode(openai.merge_error_code(b"oops", "BAD_GATEWAY"))
    assert plain["error"]["message"] == "oops" and plain["error"]["blazar_code"] == "BAD_GATEWAY"
