"""``blazar keys rm`` refuses the last key unless forced, and says what the daemon becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.cli import main
from blazar.keys import KeyStore, keys_path
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
