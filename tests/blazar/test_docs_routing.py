"""The configuration examples of docs/routing.md (and the ``[[failover]]`` one of
docs/configuration.md) load through the real config parser, and say what they show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blazar.config import Config, ConfigError, load_config, resolve_paths

DOCS = Path(__file__).resolve().parents[2] / "docs"
_TOML = re.compile(r"^```toml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def section(doc: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line), up to the next heading of that level."""
    text = (DOCS / doc).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def examples(doc: str, heading: str) -> list[str]:
    return _TOML.findall(section(doc, heading))


def _load(text: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)
    return load_config(resolve_paths())


def test_the_failover_examples_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (routing,) = examples("routing.md", "## Failover chains")
    config = _load(routing, tmp_path / "a", monkeypatch)
    smart, tiny = config.failover
    assert smart.name == "smart" and smart.targets[-1].startswith("remote:")
    assert (smart.timeout_s, smart.bench_s, smart.bench_max_s) == (30, 5, 300)
    assert [t.lane for t in tiny.parsed()] == [None, "mistralrs"]
    failover = [t for t in _TOML.findall((DOCS / "configuration.md").read_text()) if "[[failover]]" in t]
    assert failover, "docs/configuration.md has a [[failover]] example"
    for n, text in enumerate(failover):
        assert _load(text, tmp_path / f"c{n}", monkeypatch).failover


def test_the_parser_would_refuse_a_broken_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (routing,) = examples("routing.md", "## Failover chains")
    with pytest.raises(ConfigError):  # the test above could fail: a typo'd key is refused
        _load(routing.replace("bench_s", "bench_secs", 1), tmp_path, monkeypatch)


def test_the_mcp_example_loads_and_its_key_scopes_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blazar.auth.keys import Key, parse_scopes

    (example,) = examples("mcp.md", "## Configuration")
    config = _load(example, tmp_path / "m", monkeypatch)
    files, search = config.mcp
    assert config.mcp_default == ["files"] and files.approve == ["write_file", "edit_file"]
    assert search.transport == "http" and search.headers["Authorization"].startswith("Bearer ")
    scope = re.search(r"--scope (\S+)`", section("mcp.md", "## Configuration"))
    assert scope is not None
    key = Key(name="ops", digest="", hint="", mcp=parse_scopes([scope[1]]).mcp, created_at=0.0)
    assert key.allows_mcp("files", "read_file") and not key.allows_mcp("files", "move_file")
    assert not key.allows_mcp("search")
