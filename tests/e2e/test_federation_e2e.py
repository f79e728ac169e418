"""Federation on loopback: daemon A has no model and three peers: daemon B (the test model,
warm), daemon C (the same model, cold) and the instant upstream as a plain OpenAI server (a
pass-through peer).

A request to A for the model is served by B, where it is warm, in the three dialects with
the official clients, streaming included; B's audit log names A's peer key, never the
caller's; ``kill -9`` of B mid-stream ends the stream with the dialect's error event, B is
marked down and the next request goes to C; B back on its port is marked up and used again.
Answers are a few tokens: nothing here looks at speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.stub_dns import stub_dns
from tests.support import (
    MODEL,
    ROOT,
    DaemonProc,
    add_key,
    free_port,
    make_home,
    start_daemon,
    wait_until,
)

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]
REPLY = "hello from the pass-through peer"


class Pool:
    def __init__(
        self, a: DaemonProc, b: DaemonProc, c: DaemonProc, b_port: int, caller: str, peer_key: str
    ) -> None:
        self.a, self.b, self.c, self.b_port, self.caller = a, b, c, b_port, caller
        self.b_auth = {"Authorization": f"Bearer {peer_key}"}

    def peers(self) -> dict[str, dict[str, Any]]:
        doc = httpx.get(f"{self.a.url}/api/peers", headers=self.auth, timeout=30).json()
        return {p["name"]: p for p in doc["peers"]}

    def b_ready(self) -> bool:
        snap = self.peers()["b"]["snapshot"] or {}
        return any(m["state"] == "ready" for m in snap.get("loaded", []))

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.caller}"}

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.a.url}/v1", api_key=self.caller, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Pool]:
    root = tmp_path_factory.mktemp("federation")
    inst_port = free_port()
    instant = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "bench" / "instant_upstream.py")),
            *("--port", str(inst_port), "--alias", "instant-model", "--reply", REPLY),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    b_home = make_home(root / "b", model_path, config=f'audit_log = true\npreload = ["{MODEL}"]\n')
    peer_key = add_key(b_home, "peer-a")
    b_port = free_port()
    b = start_daemon(b_home, port=b_port)
    c_home = make_home(root / "c", model_path)
    c_key = add_key(c_home, "peer-a")
    c = start_daemon(c_home)
    a_home = root / "a"
    a_home.mkdir()
    (a_home / "config.toml").write_text(
        f"""
[[remotes]]
name = "b"
url = "http://127.0.0.1:{b_port}"
key = "{peer_key}"
poll_s = 0.5
poll_max_s = 1

[[remotes]]
name = "c"
url = "{c.url}"
key = "{c_key}"
poll_s = 0.5
poll_max_s = 1

[[remotes]]
name = "plain"
url = "http://127.0.0.1:{inst_port}"
poll_s = 0.5
poll_max_s = 1

[[failover]]
name = "duo"
targets = ["remote:b/{MODEL}", "remote:plain/instant-model"]
bench_s = 60
"""
    )
    caller = add_key(a_home, "caller")
    a = start_daemon(a_home)
    a.env["COLUMNS"] = "200"  # the CLI's tables unabridged
    p = Pool(a, b, c, b_port, caller, peer_key)
    try:
        wait_until(lambda: all(v["state"] == "up" for v in p.peers().values()), what="both peers up")
        # B's model warm (preloaded) before the tests look at the decision
        wait_until(lambda: p.b_ready(), timeout_s=120, what="B's engine")
        yield p
    finally:
        p.a.stop()
        p.b.stop()
        p.c.stop()
        instant.kill()
        instant.wait()


def test_peers_and_route_explain_where_the_model_goes(pool: Pool) -> None:
    peers = pool.peers()
    assert peers["b"]["kind"] == "blazar" and peers["plain"]["kind"] == "openai"
    installed = [m["name"] for m in peers["b"]["snapshot"]["installed"]]
    assert installed == [MODEL]
    listed = pool.a.cli("peers", "--json")
    doc = json.loads(listed.stdout)
    assert {p["name"] for p in doc["peers"]} == {"b", "c", "plain"}
    table = pool.a.cli("peers").stdout
    assert f"{MODEL}*" in table and "pass-through" in table
    route = json.loads(pool.a.cli("route", MODEL, "--json").stdout)
    assert route["winner"] == "b" and "warm there" in route["why"]
    rows = {c["where"]: c for c in route["candidates"]}
    assert rows["local"]["skipped"] == "does not have the model"
    assert rows["plain"]["skipped"] == "does not have the model"
    assert rows["b"]["warm"] is True and rows["b"]["expected_wait_s"] == 0.0
    assert (rows["b"]["rank"], rows["c"]["rank"], rows["c"]["warm"]) == (1, 2, False)
    said = pool.a.cli("route", MODEL).stdout
    assert "→ b:" in said


def test_the_model_warm_on_b_is_served_by_b_in_the_openai_dialect(pool: Pool) -> None:
    client = pool.oai()
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert raw.headers["x-blazar-peer"] == "b"
    assert raw.parse().choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, stream=True)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    explicit = client.completions.create(model=f"remote:b/{MODEL}", prompt="Hello", max_tokens=3)
    assert explicit.choices[0].text is not None and explicit.model == MODEL


def test_the_anthropic_and_ollama_dialects_are_relayed_too(pool: Pool) -> None:
    ant = anthropic.Anthropic(base_url=pool.a.url, api_key=pool.caller, max_retries=0, timeout=120)
    msg = ant.messages.create(model=MODEL, max_tokens=4, messages=HI)  # type: ignore[arg-type]
    assert msg.content and msg.model == MODEL
    with ant.messages.stream(model=MODEL, max_tokens=4, messages=HI) as s:  # type: ignore[arg-type]
        assert "".join(s.text_stream)
    oll = ollama.Client(host=pool.a.url, headers={"authorization": f"Bearer {pool.caller}"}, timeout=120)
    parts = list(oll.chat(model=MODEL, messages=HI, stream=True, options={"num_predict": 4}))
    assert parts[-1].done and "".join(p.message.content or "" for p in parts)


def test_a_client_that_disconnects_cancels_the_request_on_the_peer(pool: Pool) -> None:
    def b_busy() -> int:  # asked of B itself, with the key A uses there
        cap = httpx.get(f"{pool.b.url}/api/capacity", headers=pool.b_auth, timeout=30).json()
        return sum(m["in_flight"] for m in cap["models"])

    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{pool.a.url}/v1/chat/completions", json=body, headers=pool.auth, timeout=60
    ) as r:
        assert r.status_code == 200 and r.headers["x-blazar-peer"] == "b"
        chunks = r.iter_raw()  # kept: a dropped generator would close the response at once
        next(chunks)
        wait_until(lambda: b_busy() == 1, timeout_s=60, what="the request running on B")
    # closed after one chunk: B's slot is released long before 4000 tokens could be written
    wait_until(lambda: b_busy() == 0, timeout_s=60, what="B to let the request go")


def test_b_sees_a_s_peer_key_never_the_caller_s(pool: Pool) -> None:
    audit = pool.b.home / "logs" / "audit.jsonl"
    lines = wait_until(lambda: audit.exists() and audit.read_text().splitlines(), what="B's audit log")
    relayed = [json.loads(line) for line in lines if "/v1/" in line or "/api/chat" in line]
    inference = [r for r in relayed if r.get("model")]
    assert inference, lines
    assert {r["key"] for r in inference} == {"peer-a"}
    assert pool.caller not in audit.read_text() and "caller" not in {r["key"] for r in relayed}


def test_listings_include_the_peers_models_when_asked(pool: Pool) -> None:
    plain = httpx.get(f"{pool.a.url}/v1/models", headers=pool.auth, timeout=30).json()
    assert not any(m["id"].startswith("remote:") for m in plain["data"])
    doc = httpx.get(f"{pool.a.url}/v1/models?include=remote", headers=pool.auth, timeout=30).json()
    ids = {m["id"]: m for m in doc["data"]}
    assert ids[f"remote:b/{MODEL}"]["owned_by"] == "b"
    assert "remote:plain/instant-model" in ids
    bad = httpx.get(f"{pool.a.url}/v1/models?include=everything", headers=pool.auth, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["blazar_code"] == "BAD_REQUEST"


def test_a_pass_through_peer_is_routed_to_by_model_name(pool: Pool) -> None:
    raw = pool.oai().chat.completions.with_raw_response.create(model="instant-model", messages=HI)  # type: ignore[arg-type]
    assert raw.headers["x-blazar-peer"] == "plain"
    assert raw.parse().choices[0].message.content == REPLY
    # it speaks only the OpenAI routes: asked through Ollama's, the answer says where to go
    oll = ollama.Client(host=pool.a.url, headers={"authorization": f"Bearer {pool.caller}"}, timeout=60)
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="instant-model", messages=HI)
    assert e.value.status_code == 404 and "pass-through peer plain" in e.value.error


def test_unknown_peer_and_unknown_model_are_clear_errors(pool: Pool) -> None:
    client = pool.oai()
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="remote:nowhere/x", messages=HI)  # type: ignore[arg-type]
    assert e.value.body["blazar_code"] == "PEER_NOT_FOUND"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=HI)  # type: ignore[arg-type]
    assert e.value.body["blazar_code"] == "MODEL_NOT_FOUND"  # type: ignore[index]


def test_a_chain_of_remote_targets_is_served_by_its_first(pool: Pool) -> None:
    raw = pool.oai().chat.completions.with_raw_response.create(model="duo", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert raw.headers["x-blazar-target"] == f"remote:b/{MODEL}" and raw.headers["x-blazar-peer"] == "b"
    assert "x-blazar-failover" not in raw.headers


def test_a_daemon_finds_its_peers_through_a_dns_name_the_test_answers(pool: Pool, tmp_path: Path) -> None:
    # D knows no URL: an SRV name, asked of a nameserver the test runs, names B and C (one
    # host, two ports). D routes the model to B, where it is warm, in D's own peer names.
    home = tmp_path / "d"
    home.mkdir()
    b_key = pool.b_auth["Authorization"].removeprefix("Bearer ")
    c_port = int(pool.c.url.rsplit(":", 1)[1])
    with stub_dns() as dns:
        dns.records[("_blazar._tcp.pool.test", "SRV")] = [
            f"0 0 {pool.b_port} b.pool.test.",
            f"0 0 {c_port} c.pool.test.",
        ]
        dns.records[("b.pool.test", "A")] = ["127.0.0.1"]
        dns.records[("c.pool.test", "A")] = ["127.0.0.1"]
        (home / "config.toml").write_text(
            f"""
[[remotes]]
name = "pool"
dns = "_blazar._tcp.pool.test"
dns_server = "{dns.server}"
key = "{b_key}"
poll_s = 0.5
resolve_s = 1
"""
        )
        d = start_daemon(home)
        d.env["COLUMNS"] = "200"
        try:
            b_name, c_name = f"pool-127.0.0.1-{pool.b_port}", f"pool-127.0.0.1-{c_port}"

            def peers() -> dict[str, Any]:
                doc = json.loads(d.cli("peers", "--json").stdout)
                return {p["name"]: p for p in doc["peers"]}

            wait_until(lambda: peers().get(b_name, {}).get("state") == "up", what="B found through DNS")
            assert set(peers()) == {b_name, c_name}
            client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0, timeout=120)
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
            assert raw.headers["x-blazar-peer"] == b_name and raw.parse().choices[0].message.content
            # the remote's name stands for its peers: B loads it (it has it warm), C refuses
            # D's key (it is B's), and the verb says which failed
            warmed = d.cli("warm", MODEL, "--on", "pool", check=False, timeout_s=180)
            assert warmed.returncode == 1, warmed.stdout + warmed.stderr
            assert f"{b_name}: {MODEL} loaded" in warmed.stdout and f"{c_name}: failed" in warmed.stdout
            assert f"not loaded on {c_name}" in warmed.stderr
            # C leaves the SRV answer: D drops it at the next lookup
            dns.records[("_blazar._tcp.pool.test", "SRV")] = [f"0 0 {pool.b_port} b.pool.test."]
            wait_until(lambda: set(peers()) == {b_name}, what="C dropped from the pool")
        finally:
            d.stop()


def test_b_killed_mid_stream_then_marked_down_then_up_again_once_back(pool: Pool) -> None:
    client = pool.oai()
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks)
    os.kill(pool.b.proc.pid, signal.SIGKILL)
    pool.b.proc.wait()
    with pytest.raises(openai.APIError) as failed:
        for _ in chunks:
            pass
    assert "PEER_FAILED" in str(failed.value.body) or "failed during the answer" in failed.value.message
    wait_until(lambda: pool.peers()["b"]["state"] == "down", timeout_s=20, what="B marked down")
    route = json.loads(pool.a.cli("route", MODEL, "--json").stdout)
    assert route["winner"] == "c"
    assert next(c for c in route["candidates"] if c["where"] == "b")["skipped"].startswith("down")
    # the next request goes to C, which has the model cold
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert raw.headers["x-blazar-peer"] == "c" and raw.parse().choices[0].message.content
    # asked of B by name, it is a clear error
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=f"remote:b/{MODEL}", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert e.value.status_code == 503
    assert e.value.body["blazar_code"] == "PEER_UNAVAILABLE"  # type: ignore[index]
    # the chain moves on to its next target, and benches the one that is down
    raw = client.chat.completions.with_raw_response.create(model="duo", messages=HI)  # type: ignore[arg-type]
    assert raw.headers["x-blazar-target"] == "remote:plain/instant-model"
    assert raw.headers["x-blazar-failover"] == f"remote:b/{MODEL}=PEER_UNAVAILABLE"
    assert raw.parse().choices[0].message.content == REPLY
    pool.b = start_daemon(pool.b.home, port=pool.b_port)
    wait_until(lambda: pool.peers()["b"]["state"] == "up", timeout_s=30, what="B marked up again")
    wait_until(pool.b_ready, timeout_s=120, what="B's model warm again")
    route = json.loads(pool.a.cli("route", MODEL, "--json").stdout)
    rows = {c["where"]: c for c in route["candidates"]}
    assert rows["b"]["rank"] is not None and rows["b"]["warm"] and rows["c"]["warm"]  # both warm now
    raw = client.chat.completions.with_raw_response.create(
        model=f"remote:b/{MODEL}", messages=HI, max_tokens=4
    )  # type: ignore[arg-type]
    assert raw.headers["x-blazar-peer"] == "b" and raw.parse().choices[0].message.content
