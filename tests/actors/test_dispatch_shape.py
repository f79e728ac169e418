"""Every actor's dispatch is a match over its closed message union ending in
``case _: assert_never(...)``, so mypy proves that no message type goes unhandled."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_actor(cls: ast.ClassDef) -> bool:
    for base in cls.bases:
        node = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(node, ast.Name) and node.id == "Actor":
            return True
    return False


def _exhaustive(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(fn):
        if not isinstance(node, ast.Match) or not node.cases:
            continue
        last = node.cases[-1]
        if isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None and last.guard is None:
            calls = [c for c in ast.walk(last) if isinstance(c, ast.Call)]
            if any(isinstance(c.func, ast.Name) and c.func.id == "assert_never" for c in calls):
                return True
    return False


def offenders(source: str) -> list[str]:
    """Actor classes in ``source`` with no exhaustive match over their messages (in
    ``dispatch``, ``handle``, or the method dispatch hands each message to)."""
    found = []
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef) or not _is_actor(cls):
            continue
        methods = [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        if not any(f.name in ("dispatch", "handle") for f in methods) or not any(
            _exhaustive(f) for f in methods
        ):
            found.append(cls.name)
    return found


def test_every_actor_dispatch_is_exhaustive() -> None:
    actors_found = 0
    bad: dict[str, list[str]] = {}
    for path in sorted((ROOT / "actors").rglob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        actors_found += sum(1 for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and _is_actor(c))
        if names := offenders(source):
            bad[str(path.relative_to(ROOT))] = names
    assert actors_found >= 4  # engine, admission, ledger, lifecycle
    assert bad == {}


def test_a_dispatch_without_assert_never_is_caught() -> None:
    source = """
class Quiet(Actor[Msg]):
    def dispatch(self, env):
        match env.message:
            case Ping():
                pass
            case _:
                pass
"""
    assert offenders(source) == ["Quiet"]
