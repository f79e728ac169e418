"""What the packages import is what pyproject.toml declares, no more and no less."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("blazar", "actors", "registry")
# Optional lanes are not installed in every environment, so their import names are known here.
OPTIONAL = {"pynvml": ["nvidia-ml-py"]}
# A namespace package is shared by several distributions: the longest module prefix names one.
NAMESPACES = {
    "opentelemetry": "opentelemetry-api",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
}


def _namespace_dist(module: str) -> str | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if (dist := NAMESPACES.get(".".join(parts[:end]))) is not None:
            return dist
    return None


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {
        _name(r) for name, reqs in project["optional-dependencies"].items() if name != "test" for r in reqs
    }
    return core, extras


def _imported() -> dict[str, set[str]]:
    """Distribution → the first-party modules that import it (top-level or lazily)."""
    dists = packages_distributions()
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                        continue
                    namespaced = _namespace_dist(name)
                    for dist in [namespaced] if namespaced else dists.get(top) or OPTIONAL.get(top, [top]):
                        found.setdefault(dist.lower().replace("_", "-"), set()).add(
                            str(path.relative_to(ROOT))
                        )
    return found


def test_every_import_is_declared() -> None:
    core, extras = _declared()
    undeclared = {dist: sorted(users) for dist, users in _imported().items() if dist not in core | extras}
    assert undeclared == {}


def test_every_dependency_is_imported() -> None:
    """Core dependencies only: an extra may bring a command-line tool (py-spy) rather than a module."""
    core, _ = _declared()
    unused = sorted(core - set(_imported()))
    assert unused == []
