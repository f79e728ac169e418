"""Round-trip YAML (ruamel.yaml): the user's comments, order and quoting survive an edit."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from blazar.connect._plan import ConnectError

__all__ = ["CommentedMap", "CommentedSeq", "dump", "load"]


def _yaml() -> YAML:
    yaml = YAML()  # round-trip mode
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # never fold a long URL or value onto a second line
    return yaml


def load(path: Path, text: str | None, default: Any) -> Any:
    """The document in ``text``, or ``default`` when there is none; ConnectError when it does not parse."""
    if text is None or not text.strip():
        return default
    try:
        doc = _yaml().load(text)
    except YAMLError as exc:
        raise ConnectError(f"{path} is not valid YAML ({exc}): fix it, then run connect again") from None
    if doc is None:
        return default
    if not isinstance(doc, type(default)):
        raise ConnectError(f"{path} holds a {type(doc).__name__}, not a {type(default).__name__}")
    return doc


def dump(doc: Any) -> str:
    buf = io.StringIO()
    _yaml().dump(doc, buf)
    return buf.getvalue()
