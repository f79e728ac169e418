"""Writing one value into a TOML file parsed by ``tomlkit``, the same way on every tomlkit
version pyproject.toml allows (0.12 to 0.15), keeping the rest of the user's text as it was.

The rules (tests/tomlkit_versions.py runs the edits of `blazar config`, `autopilot --apply` and
`blazar connect codex` on the oldest tomlkit allowed and on the installed one):

* A value blazar writes is written in blazar's style: strings in double quotes, arrays on one
  line, whatever the value it replaces looked like. The line it replaces keeps its place, its
  indentation and its trailing comment. (tomlkit 0.15.3 began keeping a replaced string's single
  quotes when given a plain ``str``; older versions wrote double quotes. Handing it a finished
  item, as here, gives double quotes on all of them.)
* A new key goes right after the last key of its table (the top of the file counts as a table
  that ends at the first ``[header]``), so comments and blank lines after that key stay with the
  header below them. In a table without keys it goes after the comment lines that open the
  table, before its first blank line. (tomlkit's own append puts a top-level key after the
  comment that heads the first table, which then reads as if it were about the new key; blazar
  used tomlkit's ``_insert_after`` against that, which tomlkit 0.15.3 removed.)
* Everything else — other values, their quoting, comments, blank lines, order — is untouched.
"""

from __future__ import annotations

from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.items import AoT, Item, Table, Whitespace

__all__ = ["put"]


def put(container: Any, name: str, value: Any) -> None:
    """Set ``name`` to ``value`` in ``container`` (a parsed document or one of its tables)."""
    item = value if isinstance(value, Item) else tomlkit.item(value)
    body = _body(container)
    if name in container or body is None or isinstance(item, (Table, AoT)):
        # A finished item replaces the old one in place, keeping its indent, comment and line
        # end; a table goes where tomlkit puts tables, after the values.
        container[name] = item
        return
    at, sibling = _place(body)
    insert = getattr(body, "_insert_at", None)
    if at < len(body.body) and insert is not None:
        # No public tomlkit API places a key among others. ``Container._insert_at`` is the same
        # in every version from 0.12.0 to 0.15.3; the tests run both ends of that range.
        insert(at, name, item)
        if isinstance(container, Table):
            dict.__setitem__(container, name, item)  # a table mirrors its container, as append does
    else:
        container[name] = item  # at the end of the table, tomlkit's append places it the same
    # Indented like the key it follows; the first key of a table like its header.
    like = sibling if sibling is not None else container
    if isinstance(like, Item):
        item.trivia.indent = like.trivia.indent.rpartition("\n")[2]  # the item tomlkit stored


def _body(container: Any) -> Container | None:
    """The container that holds ``container``'s lines, or None for kinds edited only through
    tomlkit's own assignment (inline tables, a table split across the file)."""
    if isinstance(container, Container):
        return container
    if isinstance(container, Table):
        return container.value
    return None


def _place(body: Container) -> tuple[int, Any]:
    """Where a new key goes in ``body``, and the key it follows (None when it follows none)."""
    lines = body.body
    end = next(
        (
            i
            for i, (k, v) in enumerate(lines)
            if isinstance(v, (Table, AoT)) and not (k is not None and k.is_dotted())
        ),
        len(lines),
    )
    keys = [i for i in range(end) if lines[i][0] is not None]
    if keys:
        return keys[-1] + 1, lines[keys[-1]][1]
    blank = next((i for i in range(end) if isinstance(lines[i][1], Whitespace)), end)
    return blank, None
