"""DESIGN §2: imports point down only (blazar → actors → registry); dialects are sans-io."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "registry": {"actors", "blazar", "quart", "quart_trio", "hypercorn", "cyclopts"},
    "actors": {"blazar", "quart", "quart_trio", "hypercorn", "cyclopts"},
    "blazar/dialects": {"trio", "quart", "quart_trio", "hypercorn", "httpx", "anyio", "actors", "registry"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}"
    offenders = {
        str(f.relative_to(ROOT)): sorted(_imports(f) & FORBIDDEN[package])
        for f in files
        if _imports(f) & FORBIDDEN[package]
    }
    assert offenders == {}
