"""API keys on the real daemon, made with the real CLI and used by the official clients:
every control refuses what it must, the local CLI keeps working, and a daemon bound
beyond loopback without a key refuses to start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from blazar.auth.keys import KeyStore, keys_path
from tests.support import MODEL, DaemonProc, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]


def blazar(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )


def add_key(home: Path, name: str, *flags: str) -> str:
    done = blazar(home, "keys", "add", name, *flags)
    secret = done.stdout.strip()
    assert secret.startswith("blz-") and "\n" not in secret
    return secret


class Keys:
    def __init__(self, home: Path) -> None:
        self.full = add_key(home, "full")
        self.scoped = add_key(home, "scoped", "--scope", "chat,models:qwen*")
        self.embed = add_key(home, "embed", "--scope", "embeddings")
        self.slow = add_key(home, "slow", "--rpm", "1")
        self.single = add_key(home, "single", "--max-concurrent", "1")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[tuple[DaemonProc, Keys]]:
    home = make_home(tmp_path_factory.mktemp("keys") / "home", model_path)
    keys = Keys(home)
    d = start_daemon(home)
    try:
        yield d, keys
    finally:
        d.stop()


def oai(d: DaemonProc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_openai_client_needs_a_valid_key(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    assert httpx.get(f"{d.url}/health").status_code == 200
    r = httpx.get(f"{d.url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["blazar_code"] == "UNAUTHORIZED"
    wrong = keys.full[:-4] + "abcd"
    with pytest.raises(openai.AuthenticationError) as refused:
        oai(d, wrong).models.list()
    assert wrong not in refused.value.response.text
    reply = oai(d, keys.full).chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert reply.choices[0].message.content is not None


def test_anthropic_and_ollama_clients_send_their_keys(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    ant = anthropic.Anthropic(base_url=d.url, api_key=keys.full, max_retries=0, timeout=60)
    msg = ant.messages.create(model=MODEL, max_tokens=4, messages=HI)  # type: ignore[arg-type]
    assert msg.content
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=d.url, api_key="blz-nope", max_retries=0).messages.create(
            model=MODEL,
            max_tokens=4,
            messages=HI,  # type: ignore[arg-type]
        )
    oll = ollama.Client(host=d.url, headers={"authorization": f"Bearer {keys.full}"}, timeout=60)
    assert [m.model for m in oll.list().models] == [f"{MODEL}:latest"]
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=d.url, timeout=60).list()
    assert refused.value.status_code == 401


def test_scopes_forbid_families_and_models(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    scoped = oai(d, keys.scoped)
    assert [m.id for m in scoped.models.list()] == []
    with pytest.raises(openai.PermissionDeniedError) as refused:
        scoped.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.body["blazar_code"] == "MODEL_NOT_IN_SCOPE"  # type: ignore[index]
    with pytest.raises(openai.PermissionDeniedError) as refused:
        oai(d, keys.embed).chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.body["blazar_code"] == "KEY_SCOPE_FORBIDDEN"  # type: ignore[index]
    oll = ollama.Client(host=d.url, headers={"authorization": f"Bearer {keys.scoped}"}, timeout=60)
    assert oll.list().models == [] and oll.ps().models == []
    with pytest.raises(ollama.ResponseError) as denied:
        oll.chat(model=MODEL, messages=HI)
    assert denied.value.status_code == 403
    r = httpx.get(f"{d.url}/admin/engines", headers={"authorization": f"Bearer {keys.full}"})
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "KEY_SCOPE_FORBIDDEN"


def test_rate_limit_answers_429_with_retry_after(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    client = oai(d, keys.slow)
    client.models.list()
    with pytest.raises(openai.RateLimitError) as limited:
        client.models.list()
    assert limited.value.body["blazar_code"] == "RATE_LIMITED"  # type: ignore[index]
    assert 0 < int(limited.value.response.headers["retry-after"]) <= 60


def test_concurrency_limit(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    client = oai(d, keys.single)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from 1 to 300, one number per line."}],
        max_tokens=200,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with stream:
        next(iter(stream))  # the first request runs
        with pytest.raises(openai.RateLimitError) as limited:
            client.models.list()
        assert limited.value.body["blazar_code"] == "KEY_CONCURRENCY_LIMITED"  # type: ignore[index]
    # once the stream is closed its place is free again (released when the daemon sees the close)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.models.list()
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_an_expired_key_is_refused(setup: tuple[DaemonProc, Keys]) -> None:
    d, _ = setup
    _, secret = KeyStore(keys_path(d.home)).add("gone", expires_at=time.time() - 5)  # live, as the CLI would
    with pytest.raises(openai.AuthenticationError) as refused:
        oai(d, secret).models.list()
    assert refused.value.body["blazar_code"] == "KEY_EXPIRED"  # type: ignore[index]
    assert "'gone' expired" in str(refused.value)


def test_the_local_cli_keeps_working_and_shows_key_usage(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    assert "daemon" in d.cli("ps").stdout
    for _ in range(2):
        oai(d, keys.full).models.list()
    with pytest.raises(openai.PermissionDeniedError):
        oai(d, keys.embed).chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
    listed = d.cli("keys", "list", "--json").stdout
    assert keys.full not in listed and keys.full[8:] not in listed
    usage = {k["name"]: k["usage"] for k in json.loads(listed)["keys"]}
    assert usage["full"]["requests_total"] >= 2 and usage["embed"]["refused_scope"] >= 1
    assert d.cli("run", MODEL, "Say hi", "--max-tokens", "4").returncode == 0
    # a key made while the daemon runs works on the next request
    fresh = add_key(d.home, "fresh")
    assert [m.id for m in oai(d, fresh).models.list()] == [MODEL]
    d.cli("keys", "rotate", "fresh")
    with pytest.raises(openai.AuthenticationError):
        oai(d, fresh).models.list()
    log = (d.home / "logs" / "daemon.log").read_text()
    for secret in (keys.full, keys.scoped, fresh):
        assert secret not in log


def test_a_non_loopback_bind_without_keys_refuses_to_start(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    done = blazar(home, "serve", "--host", "0.0.0.0", "--port", "0", check=False)
    assert done.returncode == 2
    assert "no API key exists" in done.stderr and "blazar keys add" in done.stderr
    assert "--insecure-open" in done.stderr
    assert not (home / "run" / "daemon.json").exists()
    opened = start_daemon(home, "--host", "0.0.0.0", "--insecure-open")
    try:
        assert httpx.get(opened.url.replace("0.0.0.0", "127.0.0.1") + "/v1/models").status_code == 200
    finally:
        opened.stop()
    add_key(home, "net")
    keyed = start_daemon(home, "--host", "0.0.0.0")
    try:
        r = httpx.get(keyed.url.replace("0.0.0.0", "127.0.0.1") + "/v1/models")
        assert r.status_code == 401
    finally:
        keyed.stop()


def test_a_batch_runs_each_request_as_the_key_that_made_it(setup: tuple[DaemonProc, Keys]) -> None:
    """The official client's batches API under a key scoped to the test model: the in-scope
    request is answered, the other fails alone with 403 MODEL_NOT_IN_SCOPE, and the ledger
    names the key for both."""
    d, _ = setup
    _, secret = KeyStore(keys_path(d.home)).add("batcher", families=("batch", "chat"), models=(f"{MODEL}*",))
    client = oai(d, secret)
    lines = [
        {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": HI, "max_tokens": 4, "temperature": 0}}
        for cid, model in (("mine", MODEL), ("theirs", "qwen3:0.6b"))
    ]  # fmt: skip
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    assert batch.output_file_id is not None and batch.error_file_id is not None
    (out,) = [json.loads(line) for line in client.files.content(batch.output_file_id).content.splitlines()]
    assert out["custom_id"] == "mine" and out["response"]["status_code"] == 200
    (err,) = [json.loads(line) for line in client.files.content(batch.error_file_id).content.splitlines()]
    assert err["custom_id"] == "theirs" and err["error"]["code"] == "MODEL_NOT_IN_SCOPE"
    assert err["response"]["status_code"] == 403
    # The items were charged to the key (their tokens), and the ledger names it, not `local`.
    token = (d.home / "run" / "local.token").read_text()
    local = {"authorization": f"Bearer {token}"}
    stats = httpx.get(f"{d.url}/admin/keys", headers=local).json()
    (usage,) = [k["usage"] for k in stats["data"] if k["name"] == "batcher"]
    assert usage["tokens_total"] > 0
    deadline = time.monotonic() + 30
    while True:
        records = httpx.get(f"{d.url}/admin/requests", params={"limit": 1000}, headers=local).json()["data"]
        items = [r for r in records if r["client"] == f"batch:{batch.id}"]
        if len(items) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sorted((r["key"], r["status"]) for r in items) == [("batcher", 200), ("batcher", 403)]
