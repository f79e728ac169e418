"""The SDK stays on Python 3.9 and on the standard library (fast: no daemon)."""

from __future__ import annotations

import ast
import compileall
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
PACKAGE = SDK / "blazar_sdk"
OPTIONAL = {"websockets"}  # the `realtime` extra, imported lazily by blazar_sdk/realtime.py


def _tool(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: make install puts it in the venv")
    return path


def test_ruff_finds_no_syntax_newer_than_3_9() -> None:
    # sdk/python/pyproject.toml sets target-version = "py39": ruff reports syntax that 3.9
    # cannot parse (match, except*, parenthesised context managers, …) as errors.
    done = subprocess.run(
        [_tool("ruff"), "check", "--target-version", "py39", "--no-cache", str(PACKAGE)],
        capture_output=True,
        text=True,
        cwd=SDK,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_checks_the_package_against_the_oldest_version_it_knows() -> None:
    # Typeshed knows what each stdlib version has: an API newer than the configured version
    # fails here (mypy checks 3.10 at the oldest; the 3.10 additions are looked for below).
    done = subprocess.run(
        [_tool("mypy"), "--config-file", str(SDK / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=SDK,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_compiles() -> None:
    assert compileall.compile_dir(str(PACKAGE), quiet=1, force=True)


def test_no_runtime_union_operator() -> None:
    # `X | Y` is fine in annotations (postponed by `from __future__ import annotations`) but
    # fails on 3.9 anywhere it is evaluated: in isinstance(), aliases, cast().
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        annotations = {id(n) for node in ast.walk(tree) for ann in _annotations(node) for n in ast.walk(ann)}
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and id(node) not in annotations:
                if any(
                    isinstance(side, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant))
                    and _typeish(side)
                    for side in (node.left, node.right)
                ):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        return [a.annotation for a in every if a is not None and a.annotation is not None] + (
            [node.returns] if node.returns is not None else []
        )
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def _typeish(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return bool(name) and (
        name[0].isupper() or name in {"int", "str", "float", "bytes", "bool", "dict", "list"}
    )


def test_imports_only_the_standard_library() -> None:
    outside = {}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "__future__" and top not in OPTIONAL:
                    outside.setdefault(path.name, []).append(name)
    assert outside == {}


NEWER_NAMES = {"anext", "aiter", "ExceptionGroup", "BaseExceptionGroup"}
NEWER_ASYNCIO = {"timeout", "TaskGroup", "Runner"}
NEWER_KEYWORDS = {"strict": "zip", "kw_only": "dataclass", "slots": "dataclass"}


def test_no_python_3_10_builtins_or_keywords() -> None:
    # What mypy's oldest target (3.10) lets through and 3.9 lacks.
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id in NEWER_NAMES:
                offenders.append(f"{path.name}:{node.lineno} {node.id}")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "asyncio"
                and node.attr in NEWER_ASYNCIO
            ):
                offenders.append(f"{path.name}:{node.lineno} asyncio.{node.attr}")
            if isinstance(node, ast.Call):
                func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                for kw in node.keywords:
                    if kw.arg in NEWER_KEYWORDS and NEWER_KEYWORDS[kw.arg] == func:
                        offenders.append(f"{path.name}:{node.lineno} {func}({kw.arg}=)")
    assert offenders == []
