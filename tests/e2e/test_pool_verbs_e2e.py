"""The operator verbs on loopback: daemon A (the test model) with two peers that have no
model: B pulls from its own sources (the wheel cache), C has no network (its pulls fail).
A's keys on both have the chat and admin scopes; a third remote names C with a chat-only key.

``blazar replicate`` to B has B pull the model itself, to C streams it from A's store (C
verifies every blob) so that C lists it with A's digest and answers a chat with it; a second
replicate finds the files there and sends nothing; a key without admin is a failure named
for its peer. ``blazar warm`` loads the model on B now. ``blazar list --remote`` shows the
peers' models beside A's. Answers are a few tokens."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import MODEL, DaemonProc, add_key, home_env, make_home, pull_env, start_daemon, wait_until

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]


def _remote(name: str, url: str, key: str) -> str:
    return f'[[remotes]]\nname = "{name}"\nurl = "{url}"\nkey = "{key}"\npoll_s = 0.5\npoll_max_s = 1\n\n'


class Pool:
    def __init__(self, a: DaemonProc, b: DaemonProc, c: DaemonProc, b_key: str, c_key: str) -> None:
        self.a, self.b, self.c = a, b, c
        self.b_auth = {"Authorization": f"Bearer {b_key}"}
        self.c_key = c_key
        self.c_auth = {"Authorization": f"Bearer {c_key}"}

    def peers(self) -> dict[str, dict[str, Any]]:
        doc = httpx.get(f"{self.a.url}/api/peers", timeout=30).json()
        return {p["name"]: p for p in doc["peers"]}

    def capacity(self, d: DaemonProc, auth: dict[str, str]) -> dict[str, Any]:
        return httpx.get(f"{d.url}/api/capacity", headers=auth, timeout=30).json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Pool]:
    root = tmp_path_factory.mktemp("poolverbs")
    b_home = root / "b"
    b_home.mkdir()
    b_key = add_key(b_home, "peer-a", "chat,admin")
    b = start_daemon(b_home, env=pull_env(b_home))  # its own source: the wheel cache
    c_home = root / "c"
    c_home.mkdir()
    c_key = add_key(c_home, "peer-a", "chat,admin")
    c_chat_key = add_key(c_home, "peer-a-chat")
    # no network there: pip finds no index and no wheel, and Hugging Face is offline
    no_network = home_env(c_home) | {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    c = start_daemon(c_home, env=no_network)
    a_home = make_home(root / "a", model_path)
    (a_home / "config.toml").write_text(
        _remote("b", b.url, b_key) + _remote("c", c.url, c_key) + _remote("c-chat", c.url, c_chat_key)
    )
    a = start_daemon(a_home)
    a.env["COLUMNS"] = "200"  # the CLI's tables unabridged
    p = Pool(a, b, c, b_key, c_key)
    try:
        wait_until(lambda: all(v["state"] == "up" for v in p.peers().values()), what="the peers up")
        yield p
    finally:
        p.a.stop()
        p.b.stop()
        p.c.stop()


def test_a_tampered_blob_is_refused_by_the_peer(pool: Pool) -> None:
    digest = pool.capacity(pool.a, {})["installed"][0]["digest"]
    sent = httpx.post(f"{pool.c.url}/api/blobs/{digest}", content=b"GGUF" + b"\0" * 4096, headers=pool.c_auth)
    assert sent.status_code == 400 and "hash to" in sent.json()["error"]
    assert sent.json()["blazar_code"] == "BAD_REQUEST"
    assert httpx.head(f"{pool.c.url}/api/blobs/{digest}", headers=pool.c_auth).status_code == 404


def test_warm_says_what_to_do_when_the_peer_lacks_the_model_or_is_unknown(pool: Pool) -> None:
    lacks = pool.a.cli("warm", MODEL, "--on", "c", check=False)
    assert lacks.returncode == 1
    assert "peer 'c' did not load" in lacks.stderr and f"blazar replicate {MODEL} --to c" in lacks.stderr
    unknown = httpx.post(f"{pool.a.url}/admin/peers/nowhere/warm", json={"model": MODEL}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "PEER_NOT_FOUND"


def test_replicate_pulls_where_the_peer_can_and_streams_where_it_cannot(pool: Pool) -> None:
    digest = pool.capacity(pool.a, {})["installed"][0]["digest"]
    done = pool.a.cli("replicate", MODEL, "--to", "b,c", timeout_s=600)
    lines = done.stdout.splitlines()
    assert f"b: success: the peer pulled it itself, {digest[:19]}" in lines, done.stdout
    assert any(line.startswith("c: the peer's pull failed") for line in lines), done.stdout
    assert any(line.startswith(f"c: sent {digest[:19]}") for line in lines), done.stdout
    assert lines[-1] == f"c: success: streamed from here, {digest[:19]}"
    installed = pool.capacity(pool.c, pool.c_auth)["installed"]
    assert [(m["name"], m["digest"]) for m in installed] == [(MODEL, digest)]
    client = openai.OpenAI(base_url=f"{pool.c.url}/v1", api_key=pool.c_key, max_retries=0, timeout=180)
    answer = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert answer.choices[0].message.content
    # the second time, every blob is already there: nothing is sent
    again = pool.a.cli("replicate", MODEL, "--to", "b,c", "--from-here").stdout.splitlines()
    assert again == [f"{p}: success: already there with the same files, {digest[:19]}" for p in "bc"]


def test_warm_loads_the_model_on_the_peer_now(pool: Pool) -> None:
    assert pool.capacity(pool.b, pool.b_auth)["models"] == []
    said = pool.a.cli("warm", MODEL, "--on", "b", timeout_s=180).stdout
    assert said.startswith(f"b: {MODEL} loaded in ") and "state there: ready" in said, said
    loaded = pool.capacity(pool.b, pool.b_auth)["models"]
    assert [(m["model"], m["state"]) for m in loaded] == [(MODEL, "ready")]
    # the warm polled B: A's snapshot of it already shows the model warm
    snap = pool.peers()["b"]["snapshot"]
    assert [m["model"] for m in snap["loaded"]] == [MODEL]
    route = json.loads(pool.a.cli("route", MODEL, "--json").stdout)
    assert next(c for c in route["candidates"] if c["where"] == "b")["warm"] is True


def test_replicate_names_the_peer_whose_key_lacks_admin(pool: Pool) -> None:
    done = pool.a.cli("replicate", MODEL, "--to", "c-chat", "--from-here", check=False)
    assert done.returncode == 1
    assert "c-chat: failed: peer 'c-chat' refused to receive blobs" in done.stdout, done.stdout
    assert "not replicated to c-chat" in done.stderr and "admin" in done.stderr


def test_list_remote_shows_the_peers_models_beside_the_local_ones(pool: Pool) -> None:
    table = pool.a.cli("list", "--remote").stdout
    rows = [line.split() for line in table.splitlines()[1:]]
    assert ["here", MODEL] == rows[0][:2]
    # warm on B (warmed) and on C (it answered a chat); c-chat is C seen through another key
    assert sorted(r[:2] for r in rows[1:] if r[0] in ("b", "c", "c-chat")) == [
        [p, f"{MODEL}*"] for p in ("b", "c", "c-chat")
    ]
    assert f"remote:c/{MODEL}" in table
    doc = json.loads(pool.a.cli("list", "--remote", "--json").stdout)
    assert [r["name"] for r in doc["local"]] == [MODEL]
    remote = {(r["peer"], r["name"]): r for r in doc["remote"]}
    assert remote[("b", MODEL)]["warm"] is True
    assert remote[("c", MODEL)]["digest"] == doc["local"][0]["digest"]
    plain = pool.a.cli("list").stdout
    assert "remote:" not in plain
