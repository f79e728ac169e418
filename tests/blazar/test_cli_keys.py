"""``blazar keys``: ``rm`` refuses the last key unless forced (and says what the daemon becomes);
``add``, ``rotate`` and ``list`` print JSON for scripts, a secret only where it is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blazar.auth.keys import KeyStore, digest_of, keys_path, new_secret, valid_secret
from blazar.cli import main
from tests.support import home_env


def keys_cli(monkeypatch: pytest.MonkeyPatch, home: Path, *args: str) -> int:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    try:
        main(["keys", *args])
    except SystemExit as done:
        return int(done.code or 0)
    return 0


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("", "open to every program and user on this machine"),
        ('host = "0.0.0.0"\n', "fails closed"),
        ('host = "0.0.0.0"\ninsecure_open = true\n', "open to everyone who can reach it"),
    ],
)
def test_the_last_key_is_removed_only_with_force(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: str,
    says: str,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(config)
    store = KeyStore(keys_path(home))
    store.add("alice")
    store.add("bob")
    assert keys_cli(monkeypatch, home, "rm", "alice") == 0
    capsys.readouterr()
    assert keys_cli(monkeypatch, home, "rm", "bob") == 1
    refused = " ".join(capsys.readouterr().err.split())
    assert "last API key" in refused and "--force" in refused and says in refused, refused
    assert [k.name for k in store.list()] == ["bob"]
    assert keys_cli(monkeypatch, home, "rm", "bob", "--force") == 0
    assert says in " ".join(capsys.readouterr().err.split())
    assert store.count() == 0


def test_keys_add_takes_a_secret_from_a_file_and_prints_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    given = new_secret()
    secret_file = tmp_path / "peer-key"
    secret_file.write_text(given + "\n")  # a mounted Secret, or `echo`, ends with a newline
    args = ("add", "pool-peer", "--secret-file", str(secret_file), "--replace")
    assert keys_cli(monkeypatch, home, *args) == 0
    assert keys_cli(monkeypatch, home, *args) == 0  # every boot runs it again
    said = capsys.readouterr()
    assert given not in said.out + said.err and "pool-peer" in said.err
    (key,) = KeyStore(keys_path(home)).list()
    assert key.digest == digest_of(given)
    secret_file.write_text("not-a-secret\n")
    assert keys_cli(monkeypatch, home, *args) == 1
    assert "43 URL-safe characters" in " ".join(capsys.readouterr().err.split())
    assert keys_cli(monkeypatch, home, "add", "x", "--secret-file", str(tmp_path / "missing")) == 1
    assert "cannot read the secret" in capsys.readouterr().err


def test_keys_add_and_rotate_print_json_with_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`add --json` and `rotate --json` give a script the secret and what the text shows of
    the key; `list --json` never holds a secret (nor its digest)."""
    home = tmp_path / "home"
    home.mkdir()
    args = ("add", "ci", "--scope", "chat,models:qwen*", "--rpm", "60", "--max-concurrent", "2", "--json")
    assert keys_cli(monkeypatch, home, *args) == 0
    added = json.loads(capsys.readouterr().out)
    store = KeyStore(keys_path(home))
    (key,) = store.list()
    assert added["name"] == "ci" and added["scopes"] == ["chat", "models:qwen*"]
    assert (added["rpm"], added["tpm"], added["max_concurrent"], added["expires_at"]) == (60, 0, 2, None)
    assert valid_secret(added["secret"]) and digest_of(added["secret"]) == key.digest
    assert added["hint"] == key.hint and "digest" not in added

    assert keys_cli(monkeypatch, home, "rotate", "ci", "--json") == 0
    rotated = json.loads(capsys.readouterr().out)
    (key,) = store.list()
    assert rotated["name"] == "ci" and rotated["scopes"] == added["scopes"] and rotated["rpm"] == 60
    assert rotated["secret"] != added["secret"] and digest_of(rotated["secret"]) == key.digest
    assert rotated["rotated_at"] is not None and "digest" not in rotated

    assert keys_cli(monkeypatch, home, "list", "--json") == 0
    printed = capsys.readouterr().out
    (listed,) = json.loads(printed)["keys"]
    assert listed["name"] == "ci" and listed["hint"] == key.hint and listed["scopes"] == added["scopes"]
    assert "secret" not in listed and "digest" not in listed
    assert added["secret"] not in printed and rotated["secret"] not in printed and key.digest not in printed

    assert keys_cli(monkeypatch, home, "rotate", "nobody", "--json") == 1
    assert "no key named" in capsys.readouterr().err


def test_keys_add_json_with_a_secret_file_echoes_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    given = new_secret()
    secret_file = tmp_path / "peer-key"
    secret_file.write_text(given + "\n")
    assert keys_cli(monkeypatch, home, "add", "peer", "--secret-file", str(secret_file), "--json") == 0
    said = capsys.readouterr()
    doc = json.loads(said.out)
    assert doc["name"] == "peer" and doc["secret"] is None and doc["hint"] == given[:8]
    assert given not in said.out + said.err
