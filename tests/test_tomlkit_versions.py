"""The oldest tomlkit the tests run the TOML edits on (tests/tomlkit_versions.py) is the floor
pyproject.toml declares: raising one without the other would test a version users cannot get,
or leave the floor untested."""

from __future__ import annotations

import re
import tomllib

from packaging.version import Version

from tests.tomlkit_versions import LOCK, ROOT, oldest_version


def test_the_oldest_tested_tomlkit_is_pyprojects_floor() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (floor,) = [m.group(1) for d in dependencies if (m := re.fullmatch(r"tomlkit>=([\w.]+)", d))]
    assert Version(oldest_version()) == Version(floor), f"regenerate {LOCK.name} for tomlkit=={floor}"
