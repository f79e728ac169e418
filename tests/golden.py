"""Golden-file helpers shared by the dialect tests.

``BLAZAR_REGEN_GOLDEN=1`` rewrites the expected files after an intended change;
a missing expected file is written on first run (and then must be reviewed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from blazar.dialects.neutral import DecodeError

REGEN = bool(os.environ.get("BLAZAR_REGEN_GOLDEN"))


def decoded(decoder: Callable[[bytes], Any], body: bytes) -> dict[str, Any]:
    """A decoder's result, or its error, as plain data to compare with a golden file."""
    try:
        return {"ok": msgspec.to_builtins(decoder(body))}
    except DecodeError as exc:
        return {"error": {"code": exc.code, "message": exc.message}}


def assert_golden_json(path: Path, got: Any) -> None:
    encoded = msgspec.json.format(msgspec.json.encode(got), indent=2) + b"\n"
    if REGEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded)
    assert msgspec.json.decode(encoded) == msgspec.json.decode(path.read_bytes())
