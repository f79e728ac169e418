"""Editing ``config.toml`` by dotted key, checked against the schema the daemon loads it with.

A key is a dotted path through ``blazar.config.Config``: ``slots``, ``engine.threads``,
``models.NAME.ctx`` (NAME may itself hold dots and slashes: everything between ``models.``
and the last dot). Values are written as TOML values (``4``, ``true``, ``"q8_0"``,
``["-ngl", "99"]``); a bare word is a string. Edits go through ``tomlkit``, so the file's
comments, order and layout stay as the user wrote them, and every write is checked by the
same strict loader as the daemon's before it replaces the file (atomically).
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import tomlkit
from tomlkit.items import Table

from blazar.config import Config, ConfigError, parse_config
from blazar.config.toml_edit import put
from registry.files import atomic_write

__all__ = [
    "Key",
    "defaults",
    "describe",
    "parse_value",
    "read_document",
    "resolve_key",
    "set_value",
    "unset_value",
    "write_checked",
]

_TABLE_LISTS = {
    "mcp": "[[mcp]]",
    "failover": "[[failover]]",
    "cascade": "[[cascade]]",
    "remotes": "[[remotes]]",
}


@dataclass(frozen=True, eq=False)
class Key:
    """One settable key of the schema."""

    path: tuple[str, ...]
    """Where it sits in the file: ``("models", "smollm2-135m", "slots")``."""
    type: Any
    default: Any
    """Its built-in default (``msgspec.NODEFAULT`` when it has none)."""

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def _fields(cls: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    return {f.name: f for f in msgspec.structs.fields(cls)}


def _strip(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type under ``Annotated`` constraints and ``| None``."""
    if isinstance(info, msgspec.inspect.Metadata):
        return _strip(info.type)
    if isinstance(info, msgspec.inspect.UnionType):
        rest = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(rest) == 1:
            return _strip(rest[0])
    return info


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return msgspec.NODEFAULT


def _unknown(name: str, where: str, choices: list[str]) -> ConfigError:
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" — did you mean `{close[0]}`?" if close else ""
    return ConfigError(f"unknown key '{name}'{where}{hint} Valid keys: {', '.join(sorted(choices))}")


def resolve_key(text: str) -> Key:
    """The schema's key for ``text``; ``ConfigError`` lists the valid keys at the level that failed."""
    if not text or text.startswith(".") or text.endswith(".") or ".." in text:
        raise ConfigError(f"'{text}' is not a key — write a dotted path such as `slots` or `engine.threads`")
    head, _, rest = text.partition(".")
    top = _fields(Config)
    if head not in top:
        raise _unknown(head, "", list(top))
    field = top[head]
    info = _strip(msgspec.inspect.type_info(field.type))
    if head in _TABLE_LISTS:
        raise ConfigError(
            f"'{head}' is a list of {_TABLE_LISTS[head]} tables, which this command does not edit one "
            "key at a time — use `blazar config edit` (docs/configuration.md shows the entries)"
        )
    if isinstance(info, msgspec.inspect.StructType):  # [engine]
        inner = _fields(info.cls)
        if not rest:
            raise ConfigError(f"'{head}' is a table — name one of its keys: {', '.join(sorted(inner))}")
        if rest not in inner:
            raise _unknown(rest, f" in [{head}]", list(inner))
        return Key(path=(head, rest), type=inner[rest].type, default=_default(inner[rest]))
    if isinstance(info, msgspec.inspect.DictType) and isinstance(
        info.value_type, msgspec.inspect.StructType
    ):  # [models."NAME"]
        inner = _fields(info.value_type.cls)
        name, _, key = rest.rpartition(".")
        if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
            name = name[1:-1]  # TOML's quoted form, as `blazar explain` and docs write it
        if not name or not key:
            raise ConfigError(
                f"write {head}.NAME.KEY (e.g. `{head}.smollm2-135m.slots`); keys of a model: "
                f"{', '.join(sorted(inner))}"
            )
        if key not in inner:
            raise _unknown(key, f' in [{head}."{name}"]', list(inner))
        return Key(path=(head, name, key), type=inner[key].type, default=_default(inner[key]))
    if rest:
        raise ConfigError(f"'{head}' is a single value, not a table: write `{head}` alone")
    return Key(path=(head,), type=field.type, default=_default(field))


def describe(tp: Any) -> str:
    """What a key takes, in words: ``an integer``, ``one of "reject", "queue"``."""
    return _describe(msgspec.inspect.type_info(tp))


def _describe(info: msgspec.inspect.Type) -> str:
    match info:
        case msgspec.inspect.Metadata(type=inner):
            return _describe(inner)
        case msgspec.inspect.UnionType(types=types):
            parts = [_describe(t) for t in types if not isinstance(t, msgspec.inspect.NoneType)]
            unset = any(isinstance(t, msgspec.inspect.NoneType) for t in types)
            return " or ".join(parts) + (" (or unset)" if unset else "")
        case msgspec.inspect.LiteralType(values=values):
            return "one of " + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in values)
        case msgspec.inspect.BoolType():
            return "true or false"
        case msgspec.inspect.IntType():
            return "an integer" + _bounds(info)
        case msgspec.inspect.FloatType():
            return "a number" + _bounds(info)
        case msgspec.inspect.StrType():
            return "a string"
        case msgspec.inspect.ListType(item_type=item):
            return f'a list of {_plural(_describe(item))}, e.g. ["-ngl", "99"]'
        case msgspec.inspect.DictType():
            return "a table (an inline { key = value } one)"
    return "a value of another kind"


def _bounds(info: Any) -> str:
    bounds = [
        f"{sign} {getattr(info, attr)}"
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if getattr(info, attr, None) is not None
    ]
    return f" ({', '.join(bounds)})" if bounds else ""


def _plural(text: str) -> str:
    return {"a string": "strings", "an integer": "integers", "a number": "numbers"}.get(text, text)


def parse_value(key: Key, text: str) -> Any:
    """``text`` as a value for ``key``: a TOML value, else the bare text as a string; refused
    (with what the key takes) when neither fits its type."""
    candidates: list[Any] = []
    try:
        candidates.append(tomllib.loads(f"v = {text}")["v"])
    except tomllib.TOMLDecodeError:
        pass
    candidates.append(text)
    first: msgspec.ValidationError | None = None
    for value in candidates:
        try:
            msgspec.convert(value, type=key.type)
        except msgspec.ValidationError as exc:
            first = first or exc
            continue
        return value
    reason = str(first).split(" - at ", 1)[0] if first else "wrong type"
    example = _example(key)
    raise ConfigError(
        f"{key.dotted} = {text} is refused ({reason}): {key.dotted} takes {describe(key.type)}"
        + (f" — e.g. `blazar config set {key.dotted} {example}`" if example else "")
    )


def _example(key: Key) -> str:
    default = key.default
    if default is msgspec.NODEFAULT or default is None or default == [] or default == {}:
        info = _strip(msgspec.inspect.type_info(key.type))
        if isinstance(info, msgspec.inspect.LiteralType):
            return str(info.values[0])
        return {
            msgspec.inspect.IntType: "4",
            msgspec.inspect.FloatType: "1.5",
            msgspec.inspect.BoolType: "true",
        }.get(type(info), "")
    return tomlkit.item(msgspec.to_builtins(default)).as_string()


def read_document(path: Path) -> tomlkit.TOMLDocument:
    if not path.exists():
        return tomlkit.document()
    try:
        return tomlkit.parse(path.read_text())
    except tomlkit.exceptions.ParseError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}) — fix it with `blazar config edit`") from None


def _table(container: Any, name: str, *, super_table: bool = False) -> Any:
    if name not in container:
        container[name] = tomlkit.table(is_super_table=super_table)
    found = container[name]
    if not isinstance(found, (Table, dict)):
        raise ConfigError(f"'{name}' in the file is not a table — fix it with `blazar config edit`")
    return found


def set_value(doc: tomlkit.TOMLDocument, key: Key, value: Any) -> None:
    """Write ``value`` at ``key`` in ``doc``, making its tables as needed. The value is written in
    blazar's style (double-quoted strings) in place of the old one, keeping that line's comment;
    a new key goes after the last key of its table (``blazar.config.toml_edit`` has the rules)."""
    container: Any = doc
    for i, part in enumerate(key.path[:-1]):
        container = _table(container, part, super_table=(i == 0 and len(key.path) == 3))
    put(container, key.path[-1], value)


def unset_value(doc: tomlkit.TOMLDocument, key: Key) -> bool:
    """Remove ``key`` from ``doc`` (and a model's table once it is empty); False when absent."""
    chain: list[Any] = [doc]
    for part in key.path[:-1]:
        if part not in chain[-1]:
            return False
        chain.append(chain[-1][part])
    if key.path[-1] not in chain[-1]:
        return False
    del chain[-1][key.path[-1]]
    for depth in range(len(chain) - 1, 0, -1):
        if len(chain[depth]) == 0 and key.path[0] == "models":
            del chain[depth - 1][key.path[depth - 1]]
        else:
            break
    return True


def write_checked(path: Path, text: str) -> Config:
    """Check ``text`` as the daemon would, then put it at ``path`` atomically (temp file, fsync,
    rename; the file's mode kept). Nothing is written when it does not load."""
    config = parse_config(text, path)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    atomic_write(path, text, mode=mode)
    return config


def defaults() -> list[tuple[str, Any, str]]:
    """Every key with its default and what it takes: ``(key, default, description)``.
    ``models.NAME.KEY`` rows stand for every model's table."""
    rows: list[tuple[str, Any, str]] = []
    for field in msgspec.structs.fields(Config):
        info = _strip(msgspec.inspect.type_info(field.type))
        if field.name in _TABLE_LISTS:
            rows.append((field.name, [], f"a list of {_TABLE_LISTS[field.name]} tables"))
        elif isinstance(info, msgspec.inspect.StructType):
            for inner in msgspec.structs.fields(info.cls):
                rows.append((f"{field.name}.{inner.name}", _default(inner), describe(inner.type)))
        elif isinstance(info, msgspec.inspect.DictType) and isinstance(
            info.value_type, msgspec.inspect.StructType
        ):
            for inner in msgspec.structs.fields(info.value_type.cls):
                rows.append((f"{field.name}.NAME.{inner.name}", _default(inner), describe(inner.type)))
        else:
            rows.append((field.name, _default(field), describe(field.type)))
    return rows
