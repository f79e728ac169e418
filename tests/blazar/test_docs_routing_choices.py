"""The configuration examples of docs/routing.md (its `n`, `best_of` and `Cascade` sections)
and of docs/configuration.md's `[[cascade]]` load with the real config parser; bad
`[[cascade]]` entries are config errors that name what is wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blazar.config import Config, ConfigError, load_config, resolve_paths

DOCS = Path(__file__).resolve().parents[2] / "docs"
SECTIONS = ("n", "best_of", "Cascade")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def _toml_blocks(text: str) -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Config:
    monkeypatch.setenv("BLAZAR_HOME", str(tmp_path))
    (tmp_path / "config.toml").write_text(text)
    return load_config(resolve_paths())


def test_routing_sections_exist() -> None:
    found = _sections((DOCS / "routing.md").read_text())
    assert set(SECTIONS) <= set(found)


def test_cascade_examples_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sections = _sections((DOCS / "routing.md").read_text())
    blocks = [b for s in SECTIONS for b in _toml_blocks(sections[s])]
    blocks += [b for b in _toml_blocks((DOCS / "configuration.md").read_text()) if "[[cascade]]" in b]
    assert len(blocks) >= 2
    for block in blocks:
        config = _load(tmp_path, monkeypatch, block)
        assert config.cascade, block
        for entry in config.cascade:
            assert len(entry.models) >= 2 and entry.name
            for pattern in [*entry.refusals, *config.cascade_refusals]:
                re.compile(pattern)
    routing = _load(tmp_path, monkeypatch, _toml_blocks(sections["Cascade"])[0])
    assert [c.name for c in routing.cascade] == ["frugal", "extract"]
    assert re.search(routing.cascade_refusals[0], "Sorry, I can't do that")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[[cascade]]\nname = "a"\nmodels = ["x"]\n', "models"),
        ('[[cascade]]\nname = "a"\nmodels = ["a", "b", "c", "d", "e"]\n', "models"),
        ('[[cascade]]\nname = "a"\nmodels = ["x", "y"]\nrefusals = ["("]\n', "not a regular expression"),
        ('cascade_refusals = ["[z"]\n', "not a regular expression"),
        (
            '[[cascade]]\nname = "a"\nmodels = ["x", "y"]\n[[cascade]]\nname = "a"\nmodels = ["x", "y"]\n',
            "unique",
        ),
        ('[[cascade]]\nname = "a"\nmodels = ["x", "y"]\ncheap = 1\n', "cheap"),
        (
            '[[cascade]]\nname = "a"\nmodels = ["x", "y"]\n[[failover]]\nname = "a"\ntargets = ["x"]\n',
            "rename one",
        ),
    ],
)
def test_bad_cascades_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, monkeypatch, text)
    assert fragment in str(info.value)
