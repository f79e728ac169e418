"""docs/api.md's parameter tables and its list of routes not implemented say what the code
does (blazar.dialects.params, blazar.dialects.unimplemented), both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blazar.dialects import params, unimplemented

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
_MARK = re.compile(r"^<!-- (params: (?P<route>\S+)|not-implemented) -->$")


def _tables() -> dict[str, list[list[str]]]:
    """The rows of the table after each marker, by route (``not-implemented`` for the 501 list)."""
    out: dict[str, list[list[str]]] = {}
    key: str | None = None
    rows: list[list[str]] = []
    for line in DOC.read_text().splitlines():
        if (m := _MARK.match(line)) is not None:
            key = m.group("route") or "not-implemented"
            assert key not in out, f"two tables for {key} in docs/api.md"
            rows = out.setdefault(key, [])
        elif key is not None and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set(cells[0]) <= {"-", ":"} and not cells[0][0].isupper():
                rows.append(cells)
        elif key is not None and rows and not line.startswith("|"):
            key = None  # the table has ended
    return out


def _name(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


def test_every_route_has_one_table() -> None:
    documented = set(_tables()) - {"not-implemented"}
    assert documented == {t.route for t in params.TABLES}


@pytest.mark.parametrize("table", params.TABLES, ids=lambda t: t.route)
def test_the_table_says_what_the_code_does(table: params.Table) -> None:
    rows = _tables()[table.route]
    documented = {_name(r[0]): r[1] for r in rows}
    assert len(documented) == len(rows), "a parameter is listed twice"
    in_code = {p.name: p.treatment.value for p in table.params.values()}
    assert sorted(set(in_code) - set(documented)) == [], "parameters missing from docs/api.md"
    assert sorted(set(documented) - set(in_code)) == [], "docs/api.md lists parameters the code does not"
    wrong = {n: (documented[n], in_code[n]) for n in in_code if documented[n] != in_code[n]}
    assert wrong == {}, "docs/api.md says (doc, code)"


def test_the_routes_not_implemented_are_the_codes() -> None:
    rows = _tables()["not-implemented"]
    documented = {(_name(r[0]), r[1].lower()) for r in rows}
    assert documented == {(u.prefix, u.dialect) for u in unimplemented.UNIMPLEMENTED}
