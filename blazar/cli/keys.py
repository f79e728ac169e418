"""``blazar keys``: add, list, rotate and remove the API keys the daemon accepts.

The keys live in ``keys.db`` under the data dir; a running daemon sees a change on
its next request. A secret is printed once, when it is made or rotated, and is
never stored (only its SHA-256).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import cyclopts
from cyclopts import Parameter
from rich.text import Text

from blazar.auth.keys import Key, KeyStore, KeyStoreError, LastKeyError, keys_path, parse_expiry, parse_scopes
from blazar.cli import app
from blazar.cli._common import Json, err, listing, out, print_json
from blazar.config import ConfigError, load_config, resolve_paths
from blazar.daemon.client import CliError, find_daemon

__all__ = ["keys"]

keys = cyclopts.App(
    name="keys",
    help="Manage API keys: once one exists, every route but /health needs a key.",
)
app.command(keys)


def _store() -> KeyStore:
    return KeyStore(keys_path(resolve_paths().data_dir))


def _print_secret(name: str, secret: str) -> None:
    err.print(f"[bold]key {name}[/] — its secret is shown this once; store it now:")
    sys.stdout.write(secret + "\n")
    sys.stdout.flush()


def _print_key_json(key: Key, secret: str | None) -> None:
    """``--json`` of ``add`` and ``rotate``: what ``keys list --json`` shows of the key, and its
    secret (shown this once; None when it came from ``--secret-file``, which is never echoed)."""
    print_json({**key.public(), "secret": secret})


@keys.command
def add(
    name: str,
    *,
    scope: Annotated[
        list[str] | None,
        Parameter(
            negative="",
            help="What the key may do, comma-separated or repeated: chat, embeddings, audio, "
            "images, batch, metrics (/metrics and /api/quantiles, for a scraper), admin (implies "
            "metrics), models:PATTERN (fnmatch), mcp:SERVER or mcp:SERVER/TOOL (allow; mcp:!… "
            "denies). Default: every family but metrics and admin, on every model and MCP server.",
        ),
    ] = None,
    rpm: Annotated[int, Parameter(help="Requests per minute (0: no limit).")] = 0,
    tpm: Annotated[int, Parameter(help="Tokens (prompt + completion) per minute (0: no limit).")] = 0,
    max_concurrent: Annotated[int, Parameter(help="Requests at once (0: no limit).")] = 0,
    expires: Annotated[
        str | None,
        Parameter(help="When the key stops working: 2026-12-31 (through that day), 2026-12-31T18:00, 30d."),
    ] = None,
    secret_file: Annotated[
        Path | None,
        Parameter(
            help="Take the key's secret from this file (`-`: stdin) instead of making one, e.g. a "
            "mounted Kubernetes Secret; it must have the form Blazar's own secrets have. Nothing "
            "is printed then.",
        ),
    ] = None,
    replace: Annotated[
        bool,
        Parameter(
            negative="",
            help="If NAME exists, give it this secret, scopes, limits and expiry instead of "
            "failing (so a start script may run the same command on every boot).",
        ),
    ] = False,
    json_: Annotated[
        bool,
        Parameter(
            name="--json",
            negative="",
            help="Print the key as JSON, its secret (once) in `secret`, instead of text.",
        ),
    ] = False,
) -> None:
    """Make the key NAME and print its secret (once)."""
    given = _read_secret(secret_file) if secret_file is not None else None
    try:
        families, models, mcp = parse_scopes(scope)
        expires_at = parse_expiry(expires) if expires is not None else None
        key, secret = _store().add(
            name,
            families=families,
            models=models,
            mcp=mcp,
            rpm=rpm,
            tpm=tpm,
            max_concurrent=max_concurrent,
            expires_at=expires_at,
            secret=given,
            replace=replace,
        )
    except KeyStoreError as exc:
        raise CliError(str(exc)) from None
    if json_:
        _print_key_json(key, None if given is not None else secret)
        return
    if given is not None:
        err.print(f"key {key.name}: the secret from {secret_file} (scopes {','.join(key.scopes)})")
        return
    _print_secret(key.name, secret)
    err.print(f"[dim]scopes {','.join(key.scopes)}; send it as `Authorization: Bearer …` or `x-api-key`[/]")


def _read_secret(path: Path) -> str:
    """The secret in ``path`` (``-``: stdin), without the newline a Secret or ``echo`` adds."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read the secret from {path}: {exc.__class__.__name__} — {exc}") from None
    return text.strip()


@keys.command
def rotate(
    name: str,
    *,
    json_: Annotated[
        bool,
        Parameter(
            name="--json",
            negative="",
            help="Print the key as JSON, its new secret (once) in `secret`, instead of text.",
        ),
    ] = False,
) -> None:
    """Give NAME a new secret (printed once); the old one stops working at once."""
    try:
        key, secret = _store().rotate(name)
    except KeyStoreError as exc:
        raise CliError(str(exc)) from None
    if json_:
        _print_key_json(key, secret)
        return
    _print_secret(key.name, secret)


@keys.command
def rm(
    name: str,
    *,
    force: Annotated[
        bool,
        Parameter(negative="", help="Remove it even if it is the last key (which turns API keys off)."),
    ] = False,
) -> None:
    """Remove the key NAME; requests with it are refused from the next one on. The last key
    goes only with --force: with none left, the daemon needs no key."""
    store = _store()
    try:
        store.remove(name, force=force)
    except LastKeyError:
        raise CliError(
            f"refusing to remove {name!r}, the last API key: {_open_after()}. Add another "
            f"key first, or remove it anyway with `blazar keys rm {name} --force`"
        ) from None
    except KeyStoreError as exc:
        raise CliError(str(exc)) from None
    out.print(f"removed key {name}")
    if store.count() == 0:
        err.print(f"[yellow]no key is left[/]: {_open_after()}")


def _open_after() -> str:
    """What the daemon (as configured) does once no key exists."""
    from actors.addresses import is_loopback  # only here: `blazar keys` stays light

    try:
        config = load_config(resolve_paths())
    except ConfigError:
        return "with no key the daemon needs none"
    if is_loopback(config.host):
        return (
            f"with no key the daemon on {config.host} is open to every program and user on this "
            "machine, admin routes included"
        )
    if config.insecure_open:
        return (
            f"with no key the daemon on {config.host} (insecure_open) is open to everyone who can "
            "reach it, admin routes included"
        )
    return (
        f"with no key the daemon on {config.host} (not loopback) fails closed: it refuses every "
        "request but /health until a key is added (only the local CLI gets in)"
    )


def _live_usage() -> dict[str, Any]:
    """Each key's usage from the running daemon, by name (empty when none runs)."""
    daemon = find_daemon(resolve_paths())
    if daemon is None:
        return {}
    try:
        stats = daemon.get("/admin/keys")
    except CliError:
        return {}
    return {k["name"]: k.get("usage") for k in stats.get("data", [])}


@keys.command(name="list")
def list_(*, json_: Json = False) -> None:
    """List the keys (name, hint, scopes, limits, expiry; never a secret) and, when a daemon
    runs, each key's usage since it started."""
    listed = _store().list()
    usage = _live_usage()
    if json_:
        print_json({"keys": [{**k.public(), "usage": usage.get(k.name)} for k in listed]})
        return
    if not listed:
        out.print("no API keys — the daemon is open to local clients; `blazar keys add NAME` makes one")
        return
    headers = ("NAME", "HINT", "SCOPES", "LIMITS", "EXPIRES", "REQUESTS", "TOKENS", "NOW", "REFUSED")
    rows: list[tuple[str | Text, ...]] = []
    now = time.time()
    for k in listed:
        u = usage.get(k.name)
        expires: str | Text
        if k.expires_at is None:
            expires = "never"
        elif k.expires_at <= now:
            expires = Text("expired", style="red")
        else:
            expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.expires_at))
        limits = ", ".join(
            f"{n} {label}"
            for n, label in ((k.rpm, "rpm"), (k.tpm, "tpm"), (k.max_concurrent, "at once"))
            if n
        )
        refused = "-" if u is None else str(u["refused_rate"] + u["refused_concurrency"] + u["refused_scope"])
        rows.append((
            k.name, k.hint + "…", ", ".join(k.scopes), limits or "-", expires,
            "-" if u is None else str(u["requests_total"]), "-" if u is None else str(u["tokens_total"]),
            "-" if u is None else str(u["in_flight"]), refused,
        ))  # fmt: skip
    # the name is what `keys rotate`/`rm` take next: never cut; the usage columns go first
    drop = ("REFUSED", "NOW", "TOKENS", "REQUESTS", "HINT", "LIMITS")
    out.print(listing(headers, rows, wrap=("SCOPES", "LIMITS"), drop=drop))
