"""``blazar config``: read and change ``config.toml`` by key, with the daemon's own checks.

Every change is checked by the loader the daemon uses before the file is replaced
(atomically, comments and order kept); a running daemon is then asked to reload it and
the command says what took effect, what reaches engines when they restart, and what
needs a daemon restart.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Annotated, Any

import cyclopts
import msgspec
import tomlkit
from cyclopts import Parameter
from rich.table import Table

from actors.config import Tunables
from actors.config_keys import changed_keys, key_class
from blazar.cli import app
from blazar.cli._common import Json, err, out, print_json
from blazar.config import Config, ConfigError, Paths, load_config, resolve_paths
from blazar.config.edit import (
    Key,
    defaults,
    parse_value,
    read_document,
    resolve_key,
    set_value,
    unset_value,
    write_checked,
)
from blazar.config.presets import PRESETS, preset_changes
from blazar.daemon.client import CliError, find_daemon

__all__ = ["config", "report_change", "write_edits"]

config = cyclopts.App(
    name="config",
    help="Read and change config.toml by key (`slots`, `engine.threads`, `models.NAME.ctx`), "
    "checked as the daemon checks it; a running daemon applies what it can at once.",
)
app.command(config)

_Yes = Annotated[bool, Parameter(name=["--yes", "-y"], negative="", help="Write without asking.")]


def _toml(value: Any) -> str:
    if value is None:
        return "unset"
    return str(tomlkit.item(msgspec.to_builtins(value)).as_string())


def _file_keys(path: Path) -> dict[str, Any]:
    """The keys the file sets, dotted (``engine.KEY``, ``models.NAME.KEY``); lists of tables whole."""
    if not path.exists():
        return {}
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}) — fix it with `blazar config edit`") from None
    flat: dict[str, Any] = {}
    for name, value in doc.items():
        if name == "engine" and isinstance(value, dict):
            flat.update({f"engine.{k}": v for k, v in value.items()})
        elif name == "models" and isinstance(value, dict):
            for model, table in value.items():
                if isinstance(table, dict):
                    flat.update({f"models.{model}.{k}": v for k, v in table.items()})
        else:
            flat[name] = value
    return flat


@config.command
def path() -> None:
    """Print where config.toml is (it may not exist yet: every key has a default)."""
    out.print(resolve_paths().config_file, markup=False)


@config.command(name="defaults")
def show_defaults(*, json_: Json = False) -> None:
    """Every key, its built-in default and what it takes (docs/configuration.md says what each does)."""
    rows = defaults()
    if json_:
        print_json([{"key": k, "default": msgspec.to_builtins(d), "takes": t} for k, d, t in rows])
        return
    table = Table("KEY", "DEFAULT", "TAKES", box=None)
    for key, default, takes in rows:
        table.add_row(key, _toml(default) if default is not msgspec.NODEFAULT else "required", takes)
    out.print(table)


@config.command(name="list")
def list_keys(*, json_: Json = False) -> None:
    """The keys config.toml sets, with their values (`blazar config defaults` for the rest)."""
    paths = resolve_paths()
    load_config(paths)  # a file the daemon would refuse is reported, not listed
    flat = _file_keys(Path(paths.config_file))
    if json_:
        print_json(flat)
        return
    if not flat:
        out.print(f"{paths.config_file} sets no key: every key has its default (`blazar config defaults`)")
        return
    for key, value in flat.items():
        out.print(f"{key} = {_toml(value)}", markup=False)


@config.command
def get(key: str, /, *, json_: Json = False) -> None:
    """Print KEY's value: the file's, else its default (said on stderr)."""
    paths = resolve_paths()
    found = resolve_key(key)
    load_config(paths)
    flat = _file_keys(Path(paths.config_file))
    if found.dotted in flat:
        value, source = flat[found.dotted], "config.toml"
    else:
        value, source = found.default, "default"
        if value is msgspec.NODEFAULT:
            value = None
    if json_:
        print_json({"key": found.dotted, "value": msgspec.to_builtins(value), "source": source})
        return
    out.print(_toml(value), markup=False)
    if source == "default":
        err.print(f"[dim]({found.dotted} is not in config.toml: its built-in default)[/]")


@config.command(name="set")
def set_(key: str, value: str, /) -> None:
    """Set KEY to VALUE (a TOML value: 4, true, "q8_0", ["-ngl", "99"]; a bare word is a string)."""
    paths = resolve_paths()
    found = resolve_key(key)
    parsed = parse_value(found, value)
    _change(paths, {found: parsed}, f"set {found.dotted} = {_toml(parsed)}")


@config.command
def unset(key: str, /) -> None:
    """Remove KEY from config.toml: its built-in default applies again."""
    paths = resolve_paths()
    found = resolve_key(key)
    if found.dotted not in _file_keys(Path(paths.config_file)):
        out.print(f"{found.dotted} is not in {paths.config_file}: nothing to do", markup=False)
        return
    _change(paths, {found: None}, f"removed {found.dotted} (default: {_toml(_plain(found.default))})")


def _plain(value: Any) -> Any:
    return None if value is msgspec.NODEFAULT else value


@config.command
def edit() -> None:
    """Open config.toml in $VISUAL or $EDITOR (vi), then check it: a file the daemon would refuse
    is not saved (the edited text is kept beside it as config.toml.rejected)."""
    paths = resolve_paths()
    target = Path(paths.config_file)
    before = load_config(paths)
    original = target.read_text() if target.exists() else "# Blazar configuration: docs/configuration.md\n"
    editor = shlex.split(os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="config-", suffix=".toml", dir=target.parent)
    draft = Path(name)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(original)
        try:
            done = subprocess.run([*editor, str(draft)])
        except OSError as exc:
            raise CliError(f"cannot start the editor {editor[0]!r} ({exc.strerror}) — set $EDITOR") from None
        if done.returncode != 0:
            raise CliError(f"the editor exited with status {done.returncode}: config.toml is unchanged")
        text = draft.read_text()
        if text == original:
            out.print("no change")
            return
        try:
            after = write_checked(target, text)
        except ConfigError as exc:
            rejected = target.with_name(target.name + ".rejected")
            rejected.write_text(text)
            raise CliError(
                f"{exc}\nconfig.toml is unchanged; your edit is in {rejected} — fix it and run "
                "`blazar config edit` again"
            ) from None
    finally:
        draft.unlink(missing_ok=True)
    out.print(f"saved {target}", markup=False)
    for line in report_change(paths, before, after):
        out.print(line, markup=False)


@config.command
def preset(
    name: str,
    /,
    *,
    model: Annotated[
        str | None,
        Parameter(help="Also write the preset's per-model keys for MODEL (and preload it for `agent`)."),
    ] = None,
    yes: _Yes = False,
) -> None:
    """Apply a named set of keys: balanced, throughput, low-memory or agent. The keys it writes
    are printed first; it asks before writing (--yes skips the question, and is needed without
    a terminal)."""
    if name not in PRESETS:
        raise CliError(f"unknown preset '{name}' — choose one of: {', '.join(PRESETS)}")
    chosen = PRESETS[name]
    paths = resolve_paths()
    load_config(paths)
    current = _file_keys(Path(paths.config_file))
    changes = preset_changes(chosen, current, model)
    # Keys a model's table may hold from another preset go when this one does not set them.
    if model is not None:
        for other in PRESETS.values():
            for key in other.model_keys:
                dotted = f"models.{model}.{key}"
                if key not in chosen.model_keys and dotted in current:
                    changes[dotted] = None
    out.print(f"preset {name}: {chosen.summary}", markup=False)
    if not changes:
        out.print("config.toml already has these settings: nothing to write")
        return
    for key, value in changes.items():
        line = f"  {key} = {_toml(value)}" if value is not None else f"  {key}: removed (its default applies)"
        out.print(line, markup=False)
    if not yes:
        if not sys.stdin.isatty():
            raise CliError("no terminal to confirm on: run it again with --yes to write these keys")
        answer = input(f"write these to {paths.config_file}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            out.print("nothing written")
            return
    edits = {resolve_key(key): value for key, value in changes.items()}
    _change(paths, edits, f"applied preset {name}")


def _change(paths: Paths, edits: dict[Key, Any], done: str) -> None:
    """Write ``edits`` (None: remove the key) checked and atomically, then report what they need."""
    before, after = write_edits(paths, edits)
    out.print(f"{done} in {paths.config_file}", markup=False)
    for line in report_change(paths, before, after):
        out.print(line, markup=False)


def write_edits(paths: Paths, edits: dict[Key, Any]) -> tuple[Config, Config]:
    """Write ``edits`` (None: remove the key) into config.toml, checked as the daemon loads it
    and atomically, comments and order kept: the config before and after."""
    target = Path(paths.config_file)
    before = load_config(paths)
    doc = read_document(target)
    for key, value in edits.items():
        if value is None:
            unset_value(doc, key)
        else:
            set_value(doc, key, value)
    return before, write_checked(target, tomlkit.dumps(doc))


def report_change(paths: Paths, before: Config, after: Config) -> list[str]:
    """What a change needs, in lines: applied live by a running daemon (which is asked to reload
    now), engines restarted, or a restart."""
    fields = Config.__struct_fields__
    changed = changed_keys(before, after, fields)
    if not changed:
        return []
    server = [k for k in changed if k.split(".", 1)[0] not in Tunables.__struct_fields__]
    restart = server + [k for k in changed if k not in server and key_class(k) == "restart"]
    daemon = find_daemon(paths)
    if daemon is None:
        return ["no daemon is running: the next `blazar serve` (or `blazar run`) uses it"]
    said = []
    reloaded = daemon.post("/admin/config/reload")
    if reloaded["applied"]:
        said.append(f"applied now by the running daemon: {', '.join(reloaded['applied'])}")
    if reloaded["engines"]:
        said.append(
            "engines that restart with the new settings once their requests end: "
            + ", ".join(reloaded["engines"])
        )
    elif reloaded["engine_keys"]:
        said.append(
            f"used by engines as they start: {', '.join(reloaded['engine_keys'])} (no loaded engine changes)"
        )
    if restart:
        said.append(
            f"needs a daemon restart (`blazar stop`, then `blazar serve`): {', '.join(sorted(set(restart)))}"
        )
    return said
