"""The key store (real SQLite), scope and expiry parsing, and the pure limit windows."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from blazar.auth import limits
from blazar.auth.keys import (
    DEFAULT_FAMILIES,
    Key,
    KeyStore,
    KeyStoreError,
    LastKeyError,
    digest_of,
    keys_path,
    new_secret,
    parse_expiry,
    parse_scopes,
)
from blazar.web.asgi.auth import ANY, OPEN, family_of


def test_a_key_is_stored_as_a_hash_only(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    key, secret = store.add("alice", rpm=10)
    assert secret.startswith("blz-") and len(secret) >= 40
    raw = keys_path(tmp_path).read_bytes() + (tmp_path / "keys.db-wal").read_bytes()
    assert secret.encode() not in raw
    assert key.digest == digest_of(secret) and key.hint == secret[:8]
    assert stat.S_IMODE(keys_path(tmp_path).stat().st_mode) == 0o600
    (listed,) = KeyStore(keys_path(tmp_path)).list()
    assert listed == key
    assert "digest" not in listed.public() and secret not in str(listed.public())


def test_add_refuses_a_duplicate_a_bad_name_and_the_local_name(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    store.add("alice")
    with pytest.raises(KeyStoreError, match="exists"):
        store.add("alice")
    with pytest.raises(KeyStoreError, match="1 to 64"):
        store.add("no spaces")
    with pytest.raises(KeyStoreError, match="local token"):
        store.add("local")
    with pytest.raises(KeyStoreError, match="0 \\(no limit\\)"):
        store.add("bob", rpm=-1)


def test_rotate_keeps_the_key_and_changes_its_secret(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    key, old = store.add("alice", families=("chat",), models=("qwen*",), tpm=100)
    rotated, new = store.rotate("alice")
    assert new != old and rotated.digest == digest_of(new) != key.digest
    assert (rotated.families, rotated.models, rotated.tpm) == (("chat",), ("qwen*",), 100)
    assert rotated.rotated_at is not None
    with pytest.raises(KeyStoreError, match="no key named"):
        store.rotate("nobody")


def test_remove(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    store.add("alice")
    store.add("bob")
    store.remove("alice")
    assert [k.name for k in store.list()] == ["bob"]
    with pytest.raises(KeyStoreError, match="no key named"):
        store.remove("alice")


def test_the_last_key_goes_only_when_forced(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    store.add("alice")
    with pytest.raises(LastKeyError, match="last API key"):
        store.remove("alice")
    assert store.count() == 1  # refused whole: the key still works
    with pytest.raises(KeyStoreError, match="no key named"):
        store.remove("nobody")  # an unknown name is not "the last key"
    store.remove("alice", force=True)
    assert store.list() == [] and store.count() == 0


def test_metrics_is_its_own_family_which_admin_implies() -> None:
    families = parse_scopes(["metrics"]).families
    scraper = Key(name="prom", digest="", hint="", families=families, created_at=0.0)
    assert scraper.allows_family("metrics") and not scraper.allows_family("chat")
    assert not scraper.allows_family("admin")
    admin = Key(name="ops", digest="", hint="", families=("admin",), created_at=0.0)
    assert admin.allows_family("metrics")
    default = Key(name="app", digest="", hint="", created_at=0.0)
    assert not default.allows_family("metrics") and not default.allows_family("admin")


def test_another_connection_s_commit_is_seen_as_a_change(tmp_path: Path) -> None:
    daemon_side = KeyStore(keys_path(tmp_path))
    assert daemon_side.changed()  # the first look loads
    assert not daemon_side.changed()
    cli_side = KeyStore(keys_path(tmp_path))
    cli_side.add("alice")
    assert daemon_side.changed() and [k.name for k in daemon_side.list()] == ["alice"]
    assert not daemon_side.changed()
    cli_side.rotate("alice")
    assert daemon_side.changed()


def test_scopes_default_to_every_family_but_admin_on_every_model() -> None:
    assert parse_scopes(None) == (DEFAULT_FAMILIES, ("*",), ())
    assert "admin" not in DEFAULT_FAMILIES
    assert parse_scopes(["models:qwen*"]) == (DEFAULT_FAMILIES, ("qwen*",), ())
    assert parse_scopes(["chat,embeddings", "models:a*,models:b"]) == (
        ("chat", "embeddings"),
        ("a*", "b"),
        (),
    )
    assert parse_scopes(["admin"]) == (("admin",), ("*",), ())
    assert parse_scopes(["chat,mcp:files,mcp:!files/rm"]).mcp == ("files", "!files/rm")
    with pytest.raises(KeyStoreError, match="unknown scope 'chats'"):
        parse_scopes(["chats"])
    with pytest.raises(KeyStoreError, match="needs a pattern"):
        parse_scopes(["models:"])


def test_model_patterns_are_fnmatch(tmp_path: Path) -> None:
    key, _ = KeyStore(keys_path(tmp_path)).add("a", models=("qwen*", "smollm2-135m"))
    assert key.allows_model("qwen3:0.6b") and key.allows_model("smollm2-135m")
    assert key.allows_model("smollm2-135m:latest")  # Ollama's spelling of the same name
    assert not key.allows_model("smollm2-360m") and not key.allows_model("llama-qwen")


def test_expiry_forms() -> None:
    now = 1_000_000.0
    assert parse_expiry("30d", now=now) == now + 30 * 86400
    assert parse_expiry("12h", now=now) == now + 12 * 3600
    day = parse_expiry("2999-01-31")
    end_of_day = dt.datetime(2999, 2, 1).astimezone().timestamp()
    assert day == end_of_day  # the key works through the whole day it names
    assert parse_expiry("2999-01-31T18:00+00:00") == dt.datetime(2999, 1, 31, 18, tzinfo=dt.UTC).timestamp()
    with pytest.raises(KeyStoreError, match="already past"):
        parse_expiry("2001-01-01")
    with pytest.raises(KeyStoreError, match="cannot read"):
        parse_expiry("tomorrow")


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("/health", OPEN),
        ("/healthz", OPEN),
        ("/v1/chat/completions", "chat"),
        ("/v1/messages", "chat"),
        ("/v1/messages/count_tokens", "chat"),
        ("/v1/messages/batches", "batch"),
        ("/v1/messages/batches/msgbatch_1/results", "batch"),
        ("/v1/responses", "chat"),
        ("/v1/responses/resp_1/input_items", "chat"),
        ("/v1/conversations/conv_1", "chat"),
        ("/api/generate", "chat"),
        ("/api/embed", "embeddings"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/audio/speech", "audio"),
        ("/v1/images/generations", "images"),
        ("/v1/batches", "batch"),
        ("/v1/files/file-1/content", "batch"),
        ("/v1/jobs", "batch"),
        ("/admin/engines", "admin"),
        ("/admin/models/x/unload", "admin"),
        ("/api/pull", "admin"),
        ("/api/delete", "admin"),
        ("/api/create", "admin"),
        ("/api/blobs/sha256:00", "admin"),
        ("/api/explain/qwen3:0.6b", "admin"),
        ("/api/why", "admin"),
        ("/api/why/blz-1-2", "admin"),
        ("/api/whyever", ANY),
        ("/metrics", "metrics"),
        ("/api/quantiles", "metrics"),
        ("/v1/models", ANY),
        ("/api/tags", ANY),
        ("/api/ps", ANY),
        ("/v1/requests", ANY),
        ("/v1/batchesX", ANY),
        ("/no/such/route", ANY),
    ],
)
def test_route_families(path: str, family: str) -> None:
    assert family_of(path) == family


# -- the pure limit logic ------------------------------------------------


def test_a_window_forgets_what_is_older_than_its_span() -> None:
    w = limits.Window(60.0)
    w.add(0.0, 3)
    w.add(30.0, 2)
    assert w.used(59.9) == 5
    assert w.used(60.0) == 2  # the first entry is exactly a minute old: gone
    assert w.used(90.0) == 0


def test_a_window_without_a_limit_still_forgets() -> None:
    w = limits.Window(60.0)
    for i in range(1000):
        w.add(float(i), 1)
    assert len(w.events) == 60 and w.total == 60


def test_wait_is_until_enough_has_aged_out() -> None:
    w = limits.Window(60.0)
    assert w.wait_s(0.0, 2) is None
    w.add(0.0, 1)
    w.add(10.0, 1)
    assert w.wait_s(20.0, 2) == pytest.approx(40.0)  # the first ages out at 60
    assert w.wait_s(20.0, 3) is None
    assert w.wait_s(20.0, 0) is None  # 0: no limit
    t = limits.Window(60.0)
    t.add(0.0, 500)
    t.add(5.0, 800)
    assert t.wait_s(10.0, 1000) == pytest.approx(50.0)  # once the 500 ages out, 800 fits
    assert t.wait_s(10.0, 600) == pytest.approx(55.0)  # under 600: the 800 must age out too


def test_rpm_refuses_the_request_past_the_limit_with_a_retry_after() -> None:
    u = limits.Usage()
    for i in range(3):
        d = limits.decide(u, float(i), rpm=3, tpm=0, max_concurrent=0, queue=False)
        assert d.verdict is limits.Verdict.ADMIT
        limits.admit(u, float(i), 0.0)
        u.in_flight -= 1
    d = limits.decide(u, 3.0, rpm=3, tpm=0, max_concurrent=0, queue=False)
    assert d.verdict is limits.Verdict.RATE and d.retry_after_s == pytest.approx(57.0)
    assert "3 requests per minute" in d.reason
    assert limits.decide(u, 60.0, rpm=3, tpm=0, max_concurrent=0, queue=False).verdict is limits.Verdict.ADMIT


def test_tpm_counts_the_tokens_of_requests_that_ended() -> None:
    u = limits.Usage()
    assert (
        limits.decide(u, 0.0, rpm=0, tpm=100, max_concurrent=0, queue=False).verdict is limits.Verdict.ADMIT
    )
    u.tokens.add(1.0, 100)
    d = limits.decide(u, 2.0, rpm=0, tpm=100, max_concurrent=0, queue=False)
    assert d.verdict is limits.Verdict.RATE and d.retry_after_s == pytest.approx(59.0)
    assert "100 tokens per minute" in d.reason
    assert (
        limits.decide(u, 61.0, rpm=0, tpm=100, max_concurrent=0, queue=False).verdict is limits.Verdict.ADMIT
    )


def test_concurrency_refuses_or_waits_by_policy() -> None:
    u = limits.Usage(in_flight=2)
    refuse = limits.decide(u, 0.0, rpm=0, tpm=0, max_concurrent=2, queue=False)
    assert refuse.verdict is limits.Verdict.CONCURRENCY and refuse.retry_after_s == 1.0
    assert limits.decide(u, 0.0, rpm=0, tpm=0, max_concurrent=2, queue=True).verdict is limits.Verdict.WAIT
    assert limits.decide(u, 0.0, rpm=0, tpm=0, max_concurrent=3, queue=False).verdict is limits.Verdict.ADMIT
    assert limits.decide(u, 0.0, rpm=0, tpm=0, max_concurrent=0, queue=False).verdict is limits.Verdict.ADMIT


def test_a_rate_refusal_comes_before_the_concurrency_check() -> None:
    u = limits.Usage(in_flight=1)
    u.requests.add(0.0, 1)
    d = limits.decide(u, 1.0, rpm=1, tpm=0, max_concurrent=1, queue=True)
    assert d.verdict is limits.Verdict.RATE


def test_mcp_rules_allow_and_deny_servers_and_tools(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    everything, _ = store.add("all")
    assert everything.allows_mcp("files") and everything.allows_mcp("files", "rm")
    only, _ = store.add("only", mcp=("files", "web/search"))
    assert only.allows_mcp("files") and only.allows_mcp("files", "rm")
    assert only.allows_mcp("web") and only.allows_mcp("web", "search") and not only.allows_mcp("web", "fetch")
    assert not only.allows_mcp("shell") and not only.allows_mcp("shell", "run")
    deny, _ = store.add("deny", mcp=("!shell", "!files/rm*"))
    assert not deny.allows_mcp("shell") and not deny.allows_mcp("shell", "ls")
    assert (
        deny.allows_mcp("files")
        and deny.allows_mcp("files", "read")
        and not deny.allows_mcp("files", "rmdir")
    )
    assert [k.mcp for k in store.list()] == [(), ("!shell", "!files/rm*"), ("files", "web/search")]
    with pytest.raises(KeyStoreError, match="mcp scope"):
        parse_scopes(["mcp:a/b/c"])


def test_a_keys_file_from_before_mcp_scopes_opens(tmp_path: Path) -> None:
    import sqlite3

    path = keys_path(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE keys (name TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, hint TEXT NOT NULL, "
        "families TEXT NOT NULL, models TEXT NOT NULL, rpm INTEGER NOT NULL DEFAULT 0, tpm INTEGER "
        "NOT NULL DEFAULT 0, max_concurrent INTEGER NOT NULL DEFAULT 0, expires_at REAL, created_at "
        "REAL NOT NULL, rotated_at REAL)"
    )
    conn.execute(
        "INSERT INTO keys (name, digest, hint, families, models, created_at) VALUES "
        "('old', 'd', 'blz-', 'chat', '[\"*\"]', 1.0)"
    )
    conn.commit()
    conn.close()
    [old] = KeyStore(path).list()
    assert old.name == "old" and old.mcp == () and old.allows_mcp("anything", "at-all")


def test_a_given_secret_becomes_the_key_and_replace_makes_it_idempotent(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    given = new_secret()
    key, secret = store.add("pool-peer", secret=given)
    assert secret == given and key.digest == digest_of(given) and key.rotated_at is None
    with pytest.raises(KeyStoreError, match="exists"):
        store.add("pool-peer", secret=given)
    # The same command on the next boot: nothing changes but what it sets.
    again, _ = store.add("pool-peer", secret=given, replace=True, rpm=5)
    assert again.digest == key.digest and again.rpm == 5 and again.created_at == key.created_at
    assert again.rotated_at is None
    # A new secret in the Secret: the old one stops working, as after `rotate`.
    newer = new_secret()
    rotated, _ = store.add("pool-peer", secret=newer, replace=True, families=("chat",))
    assert rotated.digest == digest_of(newer) and rotated.families == ("chat",)
    assert rotated.rotated_at is not None and [k.name for k in store.list()] == ["pool-peer"]


@pytest.mark.parametrize("secret", ["", "blz-short", "sk-" + "a" * 43, "blz-" + "a" * 42 + "!"])
def test_a_given_secret_must_have_the_form_of_blazars_own(tmp_path: Path, secret: str) -> None:
    store = KeyStore(keys_path(tmp_path))
    with pytest.raises(KeyStoreError, match="43 URL-safe characters") as info:
        store.add("pool-peer", secret=secret)
    assert "secrets.token_urlsafe(32)" in str(info.value)
    assert store.count() == 0


def test_one_secret_cannot_be_two_keys(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    given = new_secret()
    store.add("pool-peer", secret=given)
    with pytest.raises(KeyStoreError, match="already key 'pool-peer'"):
        store.add("clients", secret=given, replace=True)
    assert [k.name for k in store.list()] == ["pool-peer"]
