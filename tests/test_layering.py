"""DESIGN §2 and §10: imports point down only (blazar → actors → registry), dialects are
sans-io, the service layer (blazar/serve) and everything beside the HTTP layer (telemetry,
CLI, ops, auth, config, errors) never reach up into it, and no module grows past 800 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MAX_LINES = 800
SIZED = ("blazar", "actors", "registry", "bench", "scripts", "tests", "sdk")

# A dotted name forbids that module and everything under it.
FORBIDDEN = {
    # The SDK is its own distribution: it talks to the daemon over HTTP only.
    "sdk/python/blazar_sdk": {"blazar", "actors", "registry", "msgspec", "httpx", "trio"},
    "registry": {"actors", "blazar", "quart", "quart_trio", "hypercorn", "cyclopts"},
    "actors": {"blazar", "quart", "quart_trio", "hypercorn", "cyclopts"},
    # The service layer: what a request does between its route and the runtime, usable
    # without the HTTP layer (DESIGN §2, the renovation).
    "blazar/serve": {
        "quart",
        "quart_trio",
        "hypercorn",
        "werkzeug",
        "blazar.web",
        "blazar.cli",
        "blazar.daemon",
    },
    # Below the HTTP layer, or beside it: they never reach into it.
    "blazar/telemetry": {"blazar.web"},
    "blazar/cli": {"blazar.web"},
    "blazar/ops": {"blazar.web", "blazar.serve"},
    "blazar/auth": {"blazar.web", "blazar.serve", "blazar.cli"},
    "blazar/config": {"blazar.web", "blazar.serve", "blazar.cli"},
    "blazar/errors": {"blazar.web", "blazar.serve", "blazar.cli", "blazar.daemon"},
    "blazar/dialects": {
        "trio",
        "quart",
        "quart_trio",
        "hypercorn",
        "httpx",
        "anyio",
        "actors",
        "registry",
        "blazar.web",
        "blazar.cli",
        "blazar.daemon",
    },
}


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """The dotted module name of a source file, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) may import, as absolute dotted names.

    Relative imports are resolved against ``module``; ``from a import b`` counts both ``a``
    and ``a.b``, since ``b`` may be a submodule.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - node.level + 1]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base:
                names.add(base)
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return names


def forbidden_imports(names: set[str], forbidden: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))


def _imports_of(path: Path) -> set[str]:
    module, is_package = _module_name(path, ROOT)
    return imported_modules(path.read_text(), module, is_package=is_package)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}"
    offenders = {
        str(f.relative_to(ROOT)): bad
        for f in files
        if (bad := forbidden_imports(_imports_of(f), FORBIDDEN[package]))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import blazar.web.app", "blazar.dialects.x", False),
        ("from blazar.cli import main", "blazar.dialects.x", False),
        ("from blazar.daemon import serve", "blazar.dialects.x", False),
        ("from ..web import app", "blazar.dialects.x", False),
        ("from .. import web", "blazar.dialects.x", False),
        ("from ...cli.models import run", "blazar.dialects.sub.x", False),
        ("from ..daemon.serve import main", "blazar.dialects", True),
    ],
)
def test_upward_imports_from_dialects_are_seen(source: str, module: str, is_package: bool) -> None:
    names = imported_modules(source, module, is_package=is_package)
    assert forbidden_imports(names, FORBIDDEN["blazar/dialects"]), names


@pytest.mark.parametrize(
    "source",
    [
        "from blazar.errors import Dialect",
        "from . import neutral",
        "from .neutral import Delta",
        "import msgspec",
    ],
)
def test_dialects_may_import_their_own_layer(source: str) -> None:
    names = imported_modules(source, "blazar.dialects.x")
    assert forbidden_imports(names, FORBIDDEN["blazar/dialects"]) == []


def oversized(root: Path, folders: tuple[str, ...], limit: int = MAX_LINES) -> dict[str, int]:
    """``{path: line count}`` of every ``.py`` file under ``folders`` longer than ``limit`` lines."""
    counts: dict[str, int] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_bytes().splitlines())
            if n > limit:
                counts[str(path.relative_to(root))] = n
    return counts


def test_no_module_over_800_lines() -> None:
    offenders = oversized(ROOT, SIZED)
    assert offenders == {}, "split these along their seams: " + ", ".join(
        f"{path} ({n} lines)" for path, n in sorted(offenders.items())
    )


def test_oversized_names_each_offender(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "sub" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "notes.txt").write_text("x\n" * 2000)
    assert oversized(tmp_path, ("pkg",)) == {"pkg/sub/big.py": MAX_LINES + 1}


_CONTEXT_NAMES = ("current_or_none", "_CURRENT", "ContextVar")


def reads_request_context(source: str) -> bool:
    """Whether ``source`` names the HTTP layer's request context variable (or makes one)."""
    return any(name in source for name in _CONTEXT_NAMES)


def test_the_service_layer_never_reads_the_request_context_variable() -> None:
    """The service layer takes the request's context as an argument (``serve.context.Ask``):
    the HTTP layer's context variable (``blazar.web.asgi.call``) is not for it, even by name."""
    readers = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "blazar" / "serve").rglob("*.py")
        if reads_request_context(p.read_text())
    )
    assert readers == []


@pytest.mark.parametrize(
    "source",
    [
        "from quart import request",
        "import quart_trio",
        "from hypercorn.trio import serve",
        "from blazar.web.asgi.call import current_or_none",
        "from ..web.routes import ollama",
    ],
)
def test_a_service_module_that_reaches_into_http_is_caught(source: str) -> None:
    names = imported_modules(source, "blazar.serve.x")
    assert forbidden_imports(names, FORBIDDEN["blazar/serve"]), names


def test_a_service_module_that_reads_the_context_variable_is_caught() -> None:
    assert reads_request_context("call = current_or_none()\n")
    assert not reads_request_context("ask = Ask.job()\n")
