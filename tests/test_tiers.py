"""The slow tier keeps its real engines, daemons, browsers and clients: a change that speeds
the suite up by dropping them (a mark removed, a module emptied) fails here first.

Counted from the source, not by collecting the suite, so this stays in the fast tier: a test
function is slow when its module's ``pytestmark`` or its own decorators name ``mark.slow``.
docs/development.md ("What the slow tier runs for real") lists these modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = (ROOT / "tests", ROOT / "sdk" / "python" / "tests")
# The count when the suite was last cut for time (docs/development.md): raise it as tests are
# added; lowering it needs the reason in the commit that does.
SLOW_FLOOR = 478


def _names_slow(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "slow" for n in ast.walk(node))


def slow_tests() -> dict[str, int]:
    """Module (relative path) → its slow test functions, parametrized ones counted once."""
    found: dict[str, int] = {}
    for tree in TREES:
        for path in sorted(tree.rglob("test_*.py")):
            module = ast.parse(path.read_text())
            marked = any(
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
                and _names_slow(stmt.value)
                for stmt in module.body
            )
            count = sum(
                1
                for node in ast.walk(module)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name.startswith("test_")
                and (marked or any(_names_slow(d) for d in node.decorator_list))
            )
            if count:
                found[str(path.relative_to(ROOT))] = count
    return found


def test_the_slow_tier_keeps_its_real_tests() -> None:
    total = sum(slow_tests().values())
    assert total >= SLOW_FLOOR, (
        f"{total} slow tests, below the floor of {SLOW_FLOOR}: a test that ran a real engine, "
        "daemon, browser or client no longer does (see docs/development.md)"
    )
