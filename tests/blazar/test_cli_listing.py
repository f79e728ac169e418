"""The CLI's listings never cut a name: narrow terminals lose or wrap the other columns.

A model's or key's name is what the user types next (`blazar run NAME`, `keys rotate NAME`),
so at 80 or 60 columns it must still be on one line, whole, with no '…'.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rich.text import Text

from blazar.auth.keys import KeyStore, keys_path
from blazar.cli import main
from blazar.cli._common import listing, out
from registry.store import ModelRecord, Store
from tests.support import home_env

NAMES = ("whisper-tiny.en", "smollm2-135m", "hf.co/qwen/qwen3-0.6b-gguf:q8_0")


def run_cli(monkeypatch: pytest.MonkeyPatch, home: Path, *args: str) -> int:
    for key, value in home_env(home).items():
        monkeypatch.setenv(key, value)
    try:
        main(list(args))
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def whole_on_one_line(name: str, printed: str) -> bool:
    return any(name in line for line in printed.splitlines())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home whose store holds models of long names from long sources (manifests only)."""
    home = tmp_path / "home"
    store = Store(home / "models")
    now = time.time()
    for i, name in enumerate(NAMES):
        digest = f"sha256:{i:064x}"
        store.write_manifest(
            ModelRecord(
                name=name,
                digest=digest,
                size=139_000_000 + i,
                path=str(store.blob_path(digest.removeprefix("sha256:"))),
                source=f"hf.co/bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-Q8_0-{i}.gguf",
                created_at=now - 200,
                modified_at=now - 200,
            )
        )
    return home


@pytest.mark.parametrize("columns", [80, 60])
def test_list_keeps_every_model_name_whole(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], columns: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert run_cli(monkeypatch, home, "list") == 0
    printed = capsys.readouterr().out
    for name in NAMES:
        assert whole_on_one_line(name, printed), printed
    assert "…" not in printed
    assert all(len(line) <= columns for line in printed.splitlines()), printed
    header = printed.splitlines()[0].split()
    assert header[0] == "NAME" and "SIZE" in header and "SOURCE" not in header, header


def test_list_to_a_pipe_prints_whole_rows(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No terminal and no $COLUMNS: nothing to fit, every column on each row (for grep)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert not out.is_terminal
    assert run_cli(monkeypatch, home, "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "FORMAT", "DIGEST", "SIZE", "MODIFIED", "SOURCE"]
    for name in NAMES:
        (row,) = [line for line in lines if name in line]
        assert "Instruct-Q8_0-" in row and "139.0 MB" in row


def test_keys_list_keeps_a_long_key_name_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    name = "ci-nightly-release-pipeline-eu-west"
    KeyStore(keys_path(home)).add(name, rpm=60, expires_at=time.time() - 1)
    monkeypatch.setenv("COLUMNS", "60")
    assert run_cli(monkeypatch, home, "keys", "list") == 0
    printed = capsys.readouterr().out
    assert whole_on_one_line(name, printed) and "…" not in printed and "expired" in printed, printed
    assert all(len(line) <= 60 for line in printed.splitlines()), printed


def render(table: object) -> list[str]:
    with out.capture() as captured:
        out.print(table)
    return captured.get().splitlines()


def test_listing_drops_columns_in_order_then_wraps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    headers = ("NAME", "NOTE", "EXTRA", "ID")
    rows = [("hf.co/qwen/qwen3-0.6b-gguf:q8_0", "a note of several words", "x" * 20, "abcdef")]
    monkeypatch.setenv("COLUMNS", "200")
    assert render(listing(headers, rows, drop=("EXTRA", "ID")))[0].split() == list(headers)
    # 40 cells: EXTRA goes, then ID; NOTE (not droppable) wraps at its spaces
    monkeypatch.setenv("COLUMNS", "50")
    lines = render(listing(headers, rows, drop=("EXTRA", "ID")))
    assert lines[0].split() == ["NAME", "NOTE"], lines
    assert "hf.co/qwen/qwen3-0.6b-gguf:q8_0" in lines[1] and len(lines) > 2, lines
    assert " ".join(" ".join(lines[1:]).split()[1:]) == "a note of several words"
    assert all(len(line) <= 50 for line in lines)


def test_listing_never_cuts_a_name_even_wider_than_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name wider than the terminal is printed whole (the terminal wraps the line); the
    other columns fold their long words rather than end in '…'."""
    name = "hf.co/unsloth/some-very-long-repository-name-GGUF:UD-Q4_K_XL"
    monkeypatch.setenv("COLUMNS", "40")
    lines = render(listing(("NAME", "SOURCE"), [(name, Text("catalog:" + "y" * 30, style="red"))]))
    assert whole_on_one_line(name, "\n".join(lines)), lines
    assert "…" not in "\n".join(lines)
    assert "".join(line[len(name) + 2 :].strip() for line in lines[1:]) == "catalog:" + "y" * 30


def test_listing_reads_no_markup_from_plain_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    lines = render(listing(("NAME", "NOTE"), [("my[bold]model", "[red]not markup[/]")]))
    assert "my[bold]model" in lines[1] and "[red]not markup[/]" in lines[1], lines
