"""Admission by certificate: which requests need which capability, and who is refused."""

from __future__ import annotations

import pytest

from actors.certificates import Certificate, CertificateBook, Probe
from actors.config import AdmissionConfig, ModelOverride, RuntimeConfig
from actors.preflight import CapabilityFailed
from actors.preflight import check_certificates as check
from blazar.dialects.neutral import ChatRequest, Message, ResponseFormat, ToolChoice, ToolSpec
from blazar.errors import CATALOG
from blazar.serve.jobs.bench import _Sample, summarize
from blazar.serve.policy.certified import chat_needs

TOOL = ToolSpec(name="get_weather", parameters={"type": "object"})


def _book(**statuses: str) -> CertificateBook:
    probes = [
        Probe(capability=cap, status=status, detail=f"{cap} detail", answer=f"{cap} answer")  # type: ignore[arg-type]
        for cap, status in statuses.items()
    ]
    return CertificateBook(
        {"m": Certificate(model="m", engine="llamacpp-host 1", created_at=1.0, probes=probes)}
    )


def _config(**settings: object) -> RuntimeConfig:
    return RuntimeConfig.in_home("/nonexistent", **settings)


def test_chat_needs_follow_the_request() -> None:
    plain = ChatRequest(model="m", messages=[Message(role="user", content="hi")])
    assert chat_needs(plain) == []
    full = ChatRequest(
        model="m",
        messages=[Message(role="user", content="hi", images=["aGk="])],
        tools=[TOOL],
        response_format=ResponseFormat(kind="json_schema", schema={"type": "object"}),
        think=True,
    )
    assert chat_needs(full) == ["tools", "json_schema", "vision", "thinking"]
    no_tools = ChatRequest(model="m", messages=[], tools=[TOOL], tool_choice=ToolChoice(mode="none"))
    assert chat_needs(no_tools) == []
    text = ChatRequest(model="m", messages=[], response_format=ResponseFormat(kind="text"))
    assert chat_needs(text) == []


def test_a_failed_capability_is_refused_with_its_evidence() -> None:
    book = _book(chat="PASS", tools="FAIL", json_schema="PASS", vision="N/A")
    check(_config(), book, "m", ["json_schema", "vision"])  # passed, or not applicable: not refused
    check(_config(), book, "other", ["tools"])  # never certified: not refused
    with pytest.raises(CapabilityFailed) as caught:
        check(_config(), book, "m", ["json_schema", "tools"])
    err = caught.value
    assert err.code == "CAPABILITY_VERIFIED_FAILED" and CATALOG[err.code].status == 400
    assert "tools" in err.message and "tools detail" in err.message and "tools answer" in err.message
    assert "llamacpp-host 1" in err.message and "trust_certificates = false" in err.message


def test_trust_can_be_turned_off_globally_per_model_or_by_the_doctor() -> None:
    book = _book(tools="FAIL")
    check(_config(admission=AdmissionConfig(trust_certificates=False)), book, "m", ["tools"])
    check(_config(models={"m": ModelOverride(trust_certificate=False)}), book, "m", ["tools"])
    check(_config(), book, "m", ["tools"], certifying=True)
    off_but_model_on = _config(
        admission=AdmissionConfig(trust_certificates=False),
        models={"m": ModelOverride(trust_certificate=True)},
    )
    with pytest.raises(CapabilityFailed):
        check(off_but_model_on, book, "m", ["tools"])


def test_bench_levels_summarize_speeds_and_percentiles() -> None:
    samples = [
        _Sample(
            ok=True, ttft_s=0.1, gaps_s=[0.01, 0.02], decode_s=0.03, prompt_tokens=100, completion_tokens=4
        ),
        _Sample(ok=True, ttft_s=0.3, gaps_s=[0.03], decode_s=0.03, prompt_tokens=120, completion_tokens=2),
        _Sample(ok=False, error="HTTP 503: busy"),
    ]
    level = summarize(2, samples, wall_s=0.5)
    assert level["concurrency"] == 2 and level["requests"] == 3 and level["ok"] == 2
    assert level["errors"] == ["HTTP 503: busy"]
    assert level["completion_tokens"] == 6 and level["aggregate_tps"] == 12.0
    assert level["ttft_ms"]["p50"] == 200.0
    assert level["itl_ms"]["p50"] == 20.0
    assert level["itl_ms"]["p99"] == pytest.approx(29.8)  # 20 + 0.98 x (30 - 20)
    assert level["prefill_tps"] == pytest.approx(700.0)  # median of 1000 and 400 tokens/s
    assert level["decode_tps"] == pytest.approx(66.67)  # median of 100 and 33.3 tokens/s
    assert level["prompt_tokens"] == 110
    empty = summarize(1, [], wall_s=0.0)
    assert empty["ttft_ms"]["p50"] is None and empty["decode_tps"] is None and empty["aggregate_tps"] is None
