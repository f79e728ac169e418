"""Saved prompt caches and snapshots with the real engine and the official openai SDK.

- The bank: a graceful stop saves the warm slots; after a restart the same prompt is
  answered from the restored cache (``prompt_tokens_details.cached_tokens``).
- Named sessions: ``blazar session save`` / ``restore`` / ``list`` / ``rm``, and a session
  of other weights refused.
- ``blazar snapshot`` of a home with a model, a key and a stored background response,
  restored into a fresh home: the model serves, the key works, the response is there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import MODEL, add_key, make_home, pull_env, start_daemon, wait_until

pytestmark = pytest.mark.slow

# A system prompt long enough that its cache is worth keeping (about 300 tokens), short
# enough to read quickly on a busy 2-core machine.
PREFIX = "You answer questions about a small town. " + " ".join(
    f"House {i} on Main Street is painted {('red', 'blue', 'green', 'white')[i % 4]}." for i in range(30)
)


def _ask(
    url: str, question: str = "What colour is house 7?", key: str = "unused"
) -> openai.types.CompletionUsage:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": PREFIX}, {"role": "user", "content": question}],
        max_tokens=2,
        temperature=0,
    )
    assert done.usage is not None
    return done.usage


def _cached(usage: openai.types.CompletionUsage) -> int:
    details = usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details is not None else 0


def test_bank_restores_the_prompt_cache_after_a_restart(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    d = start_daemon(home)
    try:
        first = _ask(d.url)
        assert _cached(first) == 0
    finally:
        d.stop()
    banked = [json.loads(p.read_text()) for p in (home / "sessions" / MODEL).glob("_auto-*.json")]
    assert banked and max(b["tokens"] for b in banked) >= first.prompt_tokens

    d = start_daemon(home)
    try:
        again = _ask(d.url)
        # The whole shared prefix comes from the restored slot; llama.cpp reads at least the
        # last token again to sample.
        assert _cached(again) >= first.prompt_tokens - 8, again
        assert d.engines()[0]["banked_tokens"] >= first.prompt_tokens  # type: ignore[operator]
    finally:
        d.stop()


def test_a_keep_alive_unload_banks_the_slots_too(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="keep_alive_s = 1\n")
    d = start_daemon(home)
    try:
        first = _ask(d.url)
        wait_until(lambda: d.engines()[0]["state"] == "stopped", 60, "the keep-alive unload")
        banked = [json.loads(p.read_text()) for p in (home / "sessions" / MODEL).glob("_auto-*.json")]
        assert banked and max(b["tokens"] for b in banked) >= first.prompt_tokens
        assert _cached(_ask(d.url)) >= first.prompt_tokens - 8  # the next start read them back
    finally:
        d.stop()


def test_named_sessions_save_restore_list_rm(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path, config="session_bank = false\n")
    d = start_daemon(home)
    try:
        missing = d.cli("session", "save", MODEL, "town", check=False)
        assert missing.returncode == 1 and "not loaded" in missing.stderr
        empty = httpx.post(f"{d.url}/admin/sessions/save", json={"model": MODEL, "name": "x"}, timeout=60)
        assert empty.status_code == 409 and empty.json()["error"]["blazar_code"] == "SESSION_EMPTY"
        first = _ask(d.url)
        saved = json.loads(d.cli("session", "save", MODEL, "town", "--json").stdout)["session"]
        assert saved["tokens"] >= first.prompt_tokens and saved["model"] == MODEL
        listed = json.loads(d.cli("session", "list", "--json").stdout)
        assert [s["name"] for s in listed] == ["town"]

        assert httpx.post(f"{d.url}/api/evict", json={"model": MODEL}, timeout=60).json() == {
            "evicted": [MODEL]
        }
        restored = json.loads(d.cli("session", "restore", MODEL, "town", "--json").stdout)
        assert restored["tokens_restored"] == saved["tokens"]
        assert _cached(_ask(d.url)) >= first.prompt_tokens - 8

        # A session of other weights (the model was replaced since) is refused.
        meta = home / "sessions" / MODEL / "town.json"
        doc = json.loads(meta.read_text())
        meta.write_text(json.dumps({**doc, "digest": "sha256:" + "0" * 64}))
        refused = httpx.post(
            f"{d.url}/admin/sessions/restore", json={"model": MODEL, "name": "town"}, timeout=60
        )
        assert refused.status_code == 409
        assert refused.json()["error"]["blazar_code"] == "SESSION_MODEL_MISMATCH"
        unknown = httpx.post(
            f"{d.url}/admin/sessions/restore", json={"model": MODEL, "name": "nope"}, timeout=60
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "SESSION_NOT_FOUND"

        d.cli("session", "rm", "town")
        assert json.loads(d.cli("session", "list", "--json").stdout) == []
        assert not (home / "sessions" / MODEL / "town.bin").exists()
    finally:
        d.stop()


def _blazar(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=600
    )


def test_snapshot_restores_into_a_fresh_home(tmp_path: Path, model_path: Path) -> None:
    old = make_home(tmp_path / "old", model_path, config="slots = 2\n")
    secret = add_key(old, "ci", scope="chat")
    d = start_daemon(old)
    try:
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=secret, max_retries=0, timeout=300)
        resp = client.responses.create(
            model=MODEL, input="Name a colour.", max_output_tokens=8, background=True, temperature=0
        )
        deadline = time.monotonic() + 300
        while client.responses.retrieve(resp.id).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        text = client.responses.retrieve(resp.id).output_text
        archive = tmp_path / "snap.tar.gz"
        made = d.cli("snapshot", "--out", str(archive))  # while the daemon runs
        assert "1 model manifests" in made.stdout, made.stdout
    finally:
        d.stop()

    fresh = tmp_path / "fresh"
    env = pull_env(fresh)
    # The model's files are gone: the restore pulls it again by name (from the wheel cache).
    shutil.rmtree(old / "models")
    done = _blazar(env, "restore-snapshot", str(archive))
    assert done.returncode == 0, done.stderr
    assert f"{MODEL}: pulled" in done.stdout
    again = _blazar(env, "restore-snapshot", str(archive))
    assert again.returncode == 1 and "not empty" in again.stderr

    d = start_daemon(fresh, env=env)
    try:
        assert "slots = 2" in (fresh / "config.toml").read_text()
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key=secret, max_retries=0, timeout=300)
        assert client.responses.retrieve(resp.id).output_text == text
        _ask(d.url, key=secret)
        with pytest.raises(openai.AuthenticationError):
            _ask(d.url, key="sk-wrong")
    finally:
        d.stop()
