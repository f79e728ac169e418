"""``blazar keys rm`` refuses the last key unless forced, and says what the daemon becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.cli import main
from blazar.keys import KeyStore, digest_of, keys_path, new_secret
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
