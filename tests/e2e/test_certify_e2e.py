"""Certify → bench → scorecard on a real daemon and engine (SmolLM2-135M), and admission
refusing what a certificate marks FAIL in each dialect, with the official SDKs."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from actors.certificates import Certificate, Probe, certificate_statement
from tests.support import MODEL, make_home, start_daemon

pytestmark = pytest.mark.slow

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _forge_tools_failure(home: Path, engine: str) -> None:
    """A newer certificate that fails tool calls (the daemon is stopped: it reads it at start)."""
    cert = Certificate(
        model=MODEL,
        engine=engine,
        created_at=time.time(),
        probes=[
            Probe(capability="chat", status="PASS", detail="a non-empty answer", answer="Hello"),
            Probe(
                capability="tools", status="FAIL", detail="no tool call in the answer", answer="I like Paris"
            ),
        ],
    )
    sql, params = certificate_statement(cert)
    with sqlite3.connect(home / "blazar.db") as conn:
        conn.execute(sql, params)


def test_certify_bench_scorecard_and_admission(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="default_ctx = 512\nslots = 2\n")
    # The bench first: its receipt names the engine, which the forged FAIL below needs. The
    # model is then certified once, with that FAIL in force: the run that must get through
    # it is the certificate every later check reads (a second certification cost 5 s).
    d = start_daemon(home)
    try:
        receipt = json.loads(
            d.cli(
                "bench", MODEL, "--concurrency", "1,2", "--requests", "2", "--max-tokens", "4", "--ctx", "48",
                "--json", timeout_s=600,
            ).stdout
        )  # fmt: skip
        assert [lv["concurrency"] for lv in receipt["levels"]] == [1, 2]
        for level in receipt["levels"]:
            assert level["ok"] == level["requests"] == 2, level["errors"]
            assert level["ttft_ms"]["p50"] > 0 and level["itl_ms"]["p50"] > 0
            assert level["decode_tps"] > 0 and level["prefill_tps"] > 0 and level["prompt_tokens"] >= 30
        assert (
            receipt["settings"]["launch"]["slots"] == 2
            and receipt["settings"]["launch"]["ctx_per_slot"] == 512
        )

        listed = json.loads(d.cli("bench", "--list", MODEL, "--json").stdout)
        assert [r["id"] for r in listed] == [receipt["id"]]
        listing = d.cli("bench", "--list").stdout
        assert "DECODE" in listing and "bench_" in listing
    finally:
        d.stop()

    _forge_tools_failure(home, receipt["engine"])
    d = start_daemon(home)
    try:
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[TOOL],  # type: ignore[list-item]
            )
        body = refused.value.body
        assert body["blazar_code"] == "CAPABILITY_VERIFIED_FAILED"  # type: ignore[index]
        assert "tools" in body["message"] and "I like Paris" in body["message"]  # type: ignore[index]
        # without tools the same model answers
        ok = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert ok.choices[0].message.content is not None

        claude = anthropic.Anthropic(base_url=d.url, api_key="none", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as a_refused:
            claude.messages.create(
                model=MODEL,
                max_tokens=16,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
            )
        assert a_refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert a_refused.value.body["blazar_code"] == "CAPABILITY_VERIFIED_FAILED"  # type: ignore[index]

        ollama_chat = httpx.post(
            f"{d.url}/api/chat",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": [TOOL],
                "stream": False,
            },
            timeout=60,
        )
        assert ollama_chat.status_code == 400
        assert ollama_chat.json()["blazar_code"] == "CAPABILITY_VERIFIED_FAILED"
        card = json.loads(d.cli("scorecard", MODEL, "--json").stdout)
        assert card["certificate"]["capabilities"]["tools"] == "FAIL"

        # Certifying is not refused by the FAIL it replaces: the probes get through.
        cert = json.loads(d.cli("model-doctor", MODEL, "--json", timeout_s=600).stdout)
        tools = next(p for p in cert["probes"] if p["capability"] == "tools")
        assert "CAPABILITY_VERIFIED_FAILED" not in tools["answer"]
        assert tools["status"] in ("PASS", "FAIL") and tools["request"]
        statuses = {p["capability"]: p["status"] for p in cert["probes"]}
        assert list(statuses) == [
            "chat",
            "stream",
            "tools",
            "json_schema",
            "embeddings",
            "vision",
            "thinking",
        ]
        assert statuses["chat"] == "PASS" and statuses["stream"] == "PASS"
        assert statuses["vision"] == "N/A" and statuses["embeddings"] == "N/A"  # no projector, a chat model
        assert statuses["tools"] in ("PASS", "FAIL") and statuses["json_schema"] in ("PASS", "FAIL")
        for probe in cert["probes"]:
            assert probe["detail"]
            if probe["status"] != "N/A":
                assert MODEL in probe["request"] and probe["ms"] > 0
        assert cert["engine"].startswith("llamacpp")
        assert receipt["engine"] == cert["engine"]

        show = httpx.post(f"{d.url}/api/show", json={"model": MODEL}, timeout=30).json()
        assert show["capabilities"] == ["completion", "tools"]  # Ollama's meaning, unchanged
        assert show["blazar_certificate"]["capabilities"] == statuses
        assert "chat PASS" in d.cli("show", MODEL).stdout

        # A capability the real certificate failed is refused (a tiny model may fail some).
        if statuses["tools"] == "FAIL":
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "weather?"}],
                    tools=[TOOL],  # type: ignore[list-item]
                )
            assert refused.value.body["blazar_code"] == "CAPABILITY_VERIFIED_FAILED"  # type: ignore[index]

        card = json.loads(d.cli("scorecard", MODEL, "--json").stdout)
        assert card["engine"] == cert["engine"]
        assert card["certificate"]["capabilities"] == statuses and card["certificate"]["stale"] is False
        assert card["receipt"]["id"] == receipt["id"] and card["receipt"]["stale"] is False
        assert card["memory"]["total_bytes"] > card["memory"]["weights_bytes"] > 0
        text = d.cli("scorecard", MODEL).stdout
        assert "capabilities" in text and "memory" in text and "PREFILL" in text
    finally:
        d.stop()

    (home / "config.toml").write_text(
        "default_ctx = 512\nslots = 2\n[admission]\ntrust_certificates = false\n"
    )
    d = start_daemon(home)
    try:
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[TOOL],  # type: ignore[list-item]
            max_tokens=16,
        )
        assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        d.stop()

    # Another engine version for the model: what was stored predates it, and the scorecard says so.
    (home / "config.toml").write_text(f'[models."{MODEL}"]\nengine_version = "b9999"\n')
    d = start_daemon(home)
    try:
        card = json.loads(d.cli("scorecard", MODEL, "--json").stdout)
        assert card["engine"] != cert["engine"] and "b9999" in card["engine"]
        assert card["certificate"]["stale"] is True and card["receipt"]["stale"] is True
        assert "predates the active engine" in d.cli("scorecard", MODEL).stdout
    finally:
        d.stop()
