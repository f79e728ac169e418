"""The one golden-file helper of the test suite, for every dialect.

A golden file holds the answer a test expects. A missing one fails its test, so
a deleted or never-written answer cannot pass unnoticed. ``BLAZAR_REGEN_GOLDEN=1``
writes every file from what the code produces now, missing or not: run it after
an intended change, then review the diff before committing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = ["REGEN_VAR", "assert_golden", "assert_golden_json", "decoded", "regenerating"]

REGEN_VAR = "BLAZAR_REGEN_GOLDEN"


def regenerating() -> bool:
    """Whether this run rewrites golden files (read at each call, so a test can set it)."""
    return os.environ.get(REGEN_VAR, "") not in ("", "0")


def assert_golden(path: Path, got: bytes, *, as_json: bool = False) -> None:
    """``got`` must equal the golden file at ``path``: byte for byte, or as decoded JSON
    with ``as_json`` (so key spacing in a hand-edited file does not matter)."""
    if regenerating():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_bytes() != got:
            path.write_bytes(got)
        return
    if not path.exists():
        raise AssertionError(
            f"golden file {path} is missing: run the test with {REGEN_VAR}=1 to write it "
            "from the current output, then review it"
        )
    expected = path.read_bytes()
    if as_json:
        assert msgspec.json.decode(got) == msgspec.json.decode(expected), path
    else:
        assert got == expected, path


def assert_golden_json(path: Path, got: Any) -> None:
    """``got`` (plain data or msgspec structs), compared as JSON with the golden file."""
    encoded = msgspec.json.format(msgspec.json.encode(got), indent=2) + b"\n"
    assert_golden(path, encoded, as_json=True)


def decoded(decoder: Callable[[bytes], Any], body: bytes) -> dict[str, Any]:
    """A decoder's result, or its error, as plain data to compare with a golden file."""
    try:
        return {"ok": msgspec.to_builtins(decoder(body))}
    except DecodeError as exc:
        error = {"code": exc.code, "message": exc.message}
        return {"error": error | {"param": exc.param} if exc.param else error}
