"""The golden helper: a missing golden file fails its test; only a regeneration run writes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden import REGEN_VAR, assert_golden, assert_golden_json


@pytest.fixture(autouse=True)
def _not_regenerating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGEN_VAR, raising=False)


def test_a_missing_golden_file_fails_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "golden" / "case.expected.json"
    with pytest.raises(AssertionError, match="is missing"):
        assert_golden_json(path, {"a": 1})
    with pytest.raises(AssertionError, match="is missing"):
        assert_golden(path.with_suffix(".sse"), b"event: x\n\n")
    assert not (tmp_path / "golden").exists()


def test_regeneration_writes_the_missing_file_and_then_it_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "golden" / "case.expected.json"
    monkeypatch.setenv(REGEN_VAR, "1")
    assert_golden_json(path, {"b": [1, 2], "a": "x"})
    assert path.read_bytes() == b'{\n  "b": [\n    1,\n    2\n  ],\n  "a": "x"\n}\n'
    monkeypatch.delenv(REGEN_VAR)
    assert_golden_json(path, {"b": [1, 2], "a": "x"})


def test_regeneration_rewrites_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stream.sse"
    path.write_bytes(b"old\n")
    monkeypatch.setenv(REGEN_VAR, "1")
    assert_golden(path, b"new\n")
    assert path.read_bytes() == b"new\n"


def test_a_different_answer_fails(tmp_path: Path) -> None:
    path = tmp_path / "stream.sse"
    path.write_bytes(b"data: 1\n\n")
    with pytest.raises(AssertionError):
        assert_golden(path, b"data: 2\n\n")
    assert_golden(path, b"data: 1\n\n")


def test_json_goldens_compare_as_json_not_bytes(tmp_path: Path) -> None:
    path = tmp_path / "case.expected.json"
    path.write_bytes(b'{"a":1,"b":[true]}')
    assert_golden_json(path, {"a": 1, "b": [True]})
    with pytest.raises(AssertionError):
        assert_golden_json(path, {"a": 2, "b": [True]})


@pytest.mark.parametrize("value", ["", "0"])
def test_an_empty_or_zero_setting_does_not_regenerate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(REGEN_VAR, value)
    with pytest.raises(AssertionError, match="is missing"):
        assert_golden(tmp_path / "x.sse", b"x")
