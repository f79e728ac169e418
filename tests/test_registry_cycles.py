"""The modules of ``registry`` import each other without a cycle: every import counts, at
module level, inside a function (where a cycle used to hide) or under ``TYPE_CHECKING``.
``registry.store`` is the floor the others build on; what chooses between them
(``registry.imports``) sits above them all."""

from __future__ import annotations

from pathlib import Path

from tests.test_layering import imported_modules

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "registry"


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """``module → the package's modules it imports``, for every ``*.py`` under ``folder``
    (a module imported as ``from . import x`` counts as ``x``; the package itself does not)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        names = imported_modules(path.read_text(), module, is_package=is_package)
        graph[module] = {n for n in names if n in modules and n not in (module, package)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, …, a]``, or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"d"}}) == ["d", "d"]


def test_function_level_imports_count(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from .high import g\n    return g\n")
    (pkg / "high.py").write_text("from . import low\n\ndef g():\n    return low\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": set(), "pkg.high": {"pkg.low"}, "pkg.low": {"pkg.high"}}
    assert find_cycle(graph) == ["pkg.high", "pkg.low", "pkg.high"]


def test_registry_has_no_import_cycle() -> None:
    graph = import_graph(ROOT / PACKAGE, PACKAGE)
    assert "registry.store" in graph and "registry.weights" in graph["registry.imports"]
    cycle = find_cycle(graph)
    assert cycle is None, "registry's modules import each other in a cycle: " + " → ".join(cycle or [])


def test_the_store_imports_none_of_the_modules_built_on_it() -> None:
    graph = import_graph(ROOT / PACKAGE, PACKAGE)
    above = {"registry.weights", "registry.multifile", "registry.imports", "registry.pull", "registry.reuse"}
    assert not graph["registry.store"] & above
