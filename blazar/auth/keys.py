"""API keys: what each may do, stored durably as hashes in ``keys.db`` under the data dir.

A key's secret (``blz-`` and 43 URL-safe characters, 256 bits from ``secrets``) is
shown once, when it is made or rotated; the store keeps only its SHA-256. Looking a
presented secret up by its digest reveals nothing about stored secrets through
timing (the attacker does not choose the digest), and the match is confirmed with
``hmac.compare_digest``.

The CLI writes the file while the daemon runs; the daemon keeps one connection
open and asks SQLite's ``PRAGMA data_version`` per request (a few microseconds, no
disk read) whether another connection committed since, and reloads only then.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import NamedTuple

import msgspec

__all__ = [
    "ADMIN",
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "LOCAL_NAME",
    "METRICS",
    "Key",
    "KeyStore",
    "KeyStoreError",
    "LastKeyError",
    "Scopes",
    "digest_of",
    "keys_path",
    "matches",
    "new_secret",
    "parse_expiry",
    "parse_scopes",
    "valid_secret",
]

SECRET_PREFIX = "blz-"
ADMIN = "admin"
METRICS = "metrics"
"""``/metrics``, ``/api/quantiles`` and the console's read model (``/api/console/*``): what a
scraper or a dashboard needs, and nothing else."""
FAMILIES = ("chat", "embeddings", "audio", "images", "batch", METRICS, ADMIN)
DEFAULT_FAMILIES = tuple(f for f in FAMILIES if f not in (METRICS, ADMIN))
"""What a key made without ``--scope`` may do: every route family but metrics and admin, on
every model (the metrics name every key and model: they are the operator's view)."""
REQUEST_CLASSES = ("interactive", "default", "batch", "background")
"""What a ``class:NAME`` scope may name: the most urgent admission class the key may ask for."""
LOCAL_NAME = "local"
"""The name the daemon's per-boot local token authenticates as; no key may take it."""
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    families TEXT NOT NULL,
    models TEXT NOT NULL,
    mcp TEXT NOT NULL DEFAULT '[]',
    rpm INTEGER NOT NULL DEFAULT 0,
    tpm INTEGER NOT NULL DEFAULT 0,
    max_concurrent INTEGER NOT NULL DEFAULT 0,
    expires_at REAL,
    created_at REAL NOT NULL,
    rotated_at REAL
)
"""


class KeyStoreError(Exception):
    """A key operation refused: the message says why and what to do."""


class LastKeyError(KeyStoreError):
    """Removing the last key was refused (it turns auth off): ``remove(..., force=True)`` does it."""


class Key(msgspec.Struct, frozen=True, kw_only=True):
    """One API key as stored: never its secret, only the secret's SHA-256."""

    name: str
    digest: str
    hint: str
    """The secret's first characters (``blz-ab12…``), enough to tell keys apart in a list."""
    families: tuple[str, ...] = DEFAULT_FAMILIES
    models: tuple[str, ...] = ("*",)
    """fnmatch patterns of the model names the key may use."""
    mcp: tuple[str, ...] = ()
    """MCP rules: ``PATTERN`` allows, ``!PATTERN`` denies a server (``files``) or one of its
    tools (``files/read``), fnmatch. None: every configured server and tool."""
    rpm: int = 0
    """Requests per minute; 0 is no limit (as for ``tpm`` and ``max_concurrent``)."""
    tpm: int = 0
    max_concurrent: int = 0
    expires_at: float | None = None
    created_at: float
    rotated_at: float | None = None

    @property
    def scopes(self) -> list[str]:
        """The scopes as ``keys add --scope`` takes them."""
        return [*self.families, *(f"models:{m}" for m in self.models), *(f"mcp:{r}" for r in self.mcp)]

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def max_class(self) -> str | None:
        """The most urgent request class the key may ask for (a ``class:NAME`` scope); None: any."""
        return next((f.removeprefix("class:") for f in self.families if f.startswith("class:")), None)

    def allows_family(self, family: str) -> bool:
        """``admin`` implies ``metrics``; nothing else implies another family."""
        return family in self.families or (family == METRICS and ADMIN in self.families)

    def allows_model(self, name: str) -> bool:
        """``name`` (or, for Ollama's spelling ``NAME:latest``, ``NAME``) matches a pattern."""
        bare = name.removesuffix(":latest")
        return any(fnmatchcase(name, p) or fnmatchcase(bare, p) for p in self.models)

    def allows_mcp(self, server: str, tool: str | None = None) -> bool:
        """May the key use MCP server ``server`` (any of its tools), or its tool ``tool``?
        A deny wins; with allow rules, something must allow it (a server is usable when one
        of its tools is allowed)."""
        if not self.mcp:
            return True
        allows = [r for r in self.mcp if not r.startswith("!")]
        denies = [r[1:] for r in self.mcp if r.startswith("!")]
        whole = [p for p in denies if "/" not in p]
        if any(fnmatchcase(server, p) for p in whole):
            return False
        if tool is None:
            return not allows or any(fnmatchcase(server, p.partition("/")[0]) for p in allows)
        name = f"{server}/{tool}"
        if any(fnmatchcase(name, p) for p in denies if "/" in p):
            return False
        return not allows or any(fnmatchcase(name if "/" in p else server, p) for p in allows)

    def public(self) -> dict[str, object]:
        """What ``keys list`` shows: everything but the digest."""
        out = msgspec.structs.asdict(self)
        del out["digest"]
        out["scopes"] = self.scopes
        return out


def keys_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / "keys.db"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


_SECRET = re.compile(re.escape(SECRET_PREFIX) + r"[A-Za-z0-9_-]{43}")
MAKE_SECRET = "python3 -c 'import secrets; print(\"blz-\" + secrets.token_urlsafe(32))'"
"""A shell line that makes a secret of the right form where Blazar is not installed."""


def valid_secret(secret: str) -> bool:
    """Whether ``secret`` has the form of the secrets Blazar makes (so 256 random bits, which
    is why a plain SHA-256 of it is enough to store)."""
    return _SECRET.fullmatch(secret) is not None


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class Scopes(NamedTuple):
    families: tuple[str, ...]
    models: tuple[str, ...]
    mcp: tuple[str, ...] = ()


def parse_scopes(raw: list[str] | None) -> Scopes:
    """``chat,embeddings,models:qwen*,mcp:files`` (comma-separated, repeatable) → the families,
    the model patterns and the MCP rules.

    No family named: the default families (all but metrics and admin); no ``models:`` named:
    every model; no ``mcp:`` named: every configured MCP server."""
    families: list[str] = []
    models: list[str] = []
    mcp: list[str] = []
    for part in (p.strip() for item in raw or () for p in item.split(",")):
        if not part:
            continue
        if part.startswith("mcp:"):
            rule = part.removeprefix("mcp:")
            pattern = rule.removeprefix("!")
            if not pattern or pattern.count("/") > 1 or pattern.startswith("/") or pattern.endswith("/"):
                raise KeyStoreError(
                    f"`{part}`: an mcp scope is mcp:SERVER, mcp:SERVER/TOOL, or with ! to deny "
                    "(mcp:!files/delete); fnmatch patterns"
                )
            mcp.append(rule)
        elif part.startswith("models:"):
            pattern = part.removeprefix("models:")
            if not pattern:
                raise KeyStoreError("`models:` needs a pattern, e.g. `models:qwen*`")
            models.append(pattern)
        elif part in FAMILIES:
            families.append(part)
        elif part.startswith("class:"):
            name = part.removeprefix("class:")
            if name not in REQUEST_CLASSES:
                raise KeyStoreError(f"`{part}`: a class scope is class:{'|'.join(REQUEST_CLASSES)}")
            families = [f for f in families if not f.startswith("class:")]
            families.append(part)
        else:
            raise KeyStoreError(
                f"unknown scope {part!r}: use {', '.join(FAMILIES)}, models:PATTERN, mcp:PATTERN"
                " or class:CLASS"
            )
    if all(f.startswith("class:") for f in families):  # a class cap alone keeps the default families
        families = [*DEFAULT_FAMILIES, *families]
    return Scopes(
        tuple(dict.fromkeys(families)),
        tuple(dict.fromkeys(models)) or ("*",),
        tuple(dict.fromkeys(mcp)),
    )


def parse_expiry(raw: str, *, now: float | None = None) -> float:
    """``30d``/``12h``/``45m`` from now, an ISO date (the key works through that whole day,
    local time) or an ISO date and time (local time unless it names a zone)."""
    now = time.time() if now is None else now
    if m := re.fullmatch(r"(\d+)\s*([dhm])", raw.strip()):
        return now + int(m[1]) * {"d": 86400, "h": 3600, "m": 60}[m[2]]
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw.strip()):
            day = dt.date.fromisoformat(raw.strip())
            at = dt.datetime.combine(day + dt.timedelta(days=1), dt.time()).astimezone()
        else:
            at = dt.datetime.fromisoformat(raw.strip())
            at = at if at.tzinfo is not None else at.astimezone()
    except ValueError:
        raise KeyStoreError(
            f"cannot read the expiry {raw!r}: give a date (2026-12-31), a date and time "
            "(2026-12-31T18:00) or a duration (30d, 12h, 45m)"
        ) from None
    expires = at.timestamp()
    if expires <= now:
        raise KeyStoreError(f"the expiry {raw!r} is already past")
    return expires


def _check_limit(name: str, value: int) -> int:
    if value < 0:
        raise KeyStoreError(f"--{name} must be 0 (no limit) or more, got {value}")
    return value


class KeyStore:
    """``keys.db``: one small SQLite file (WAL), owner-only permissions.

    Every change is one transaction, so a reader sees a key whole or not at all."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        self._conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        if fresh:
            os.chmod(self.path, 0o600)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute(_SCHEMA)
        columns = {r[1] for r in self._conn.execute("PRAGMA table_info(keys)")}
        if "mcp" not in columns:  # a keys.db made before MCP scopes: every key reads as all servers
            self._conn.execute("ALTER TABLE keys ADD COLUMN mcp TEXT NOT NULL DEFAULT '[]'")
        self._version = -1

    def close(self) -> None:
        self._conn.close()

    def changed(self) -> bool:
        """True when another connection committed since the last call (and on the first)."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._version:
            return False
        self._version = version
        return True

    def list(self) -> list[Key]:
        rows = self._conn.execute(
            "SELECT name, digest, hint, families, models, rpm, tpm, max_concurrent, expires_at, "
            "created_at, rotated_at, mcp FROM keys ORDER BY name"
        ).fetchall()
        return [
            Key(
                name=r[0],
                digest=r[1],
                hint=r[2],
                families=tuple(f for f in r[3].split(",") if f),
                models=tuple(msgspec.json.decode(r[4])),
                rpm=r[5],
                tpm=r[6],
                max_concurrent=r[7],
                expires_at=r[8],
                created_at=r[9],
                rotated_at=r[10],
                mcp=tuple(msgspec.json.decode(r[11])),
            )
            for r in rows
        ]

    def get(self, name: str) -> Key:
        for key in self.list():
            if key.name == name:
                return key
        raise KeyStoreError(f"no key named {name!r} — see `blazar keys list`")

    def count(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM keys").fetchone()[0])

    def add(
        self,
        name: str,
        *,
        families: tuple[str, ...] = DEFAULT_FAMILIES,
        models: tuple[str, ...] = ("*",),
        mcp: tuple[str, ...] = (),
        rpm: int = 0,
        tpm: int = 0,
        max_concurrent: int = 0,
        expires_at: float | None = None,
        now: float | None = None,
        secret: str | None = None,
        replace: bool = False,
    ) -> tuple[Key, str]:
        """A new key and its secret (which nothing keeps: show it once).

        ``secret``: take this one instead of making one (it must have the form of Blazar's own,
        ``blz-`` and 43 URL-safe characters), so that a secret kept elsewhere — a Kubernetes
        Secret given to every replica — is a key on each daemon. ``replace``: a key of that name
        that exists takes the new secret, scopes, limits and expiry instead of being an error
        (a start script can then run the same command on every boot)."""
        if not _NAME.fullmatch(name):
            raise KeyStoreError(f"a key name is 1 to 64 of A-Z a-z 0-9 . _ - (got {name!r})")
        if name == LOCAL_NAME:
            raise KeyStoreError(f"{LOCAL_NAME!r} is the name of the daemon's local token: pick another")
        if secret is None:
            secret = new_secret()
        elif not valid_secret(secret):
            raise KeyStoreError(
                f"the secret given for key {name!r} is not a Blazar secret: it must be `blz-` and 43 "
                f"URL-safe characters (256 random bits) — make one with `{MAKE_SECRET}`"
            )
        key = Key(
            name=name,
            digest=digest_of(secret),
            hint=secret[:8],
            families=families,
            models=models,
            mcp=mcp,
            rpm=_check_limit("rpm", rpm),
            tpm=_check_limit("tpm", tpm),
            max_concurrent=_check_limit("max-concurrent", max_concurrent),
            expires_at=expires_at,
            created_at=time.time() if now is None else now,
        )
        taken = self._conn.execute("SELECT name FROM keys WHERE digest = ?", (key.digest,)).fetchone()
        if taken is not None and taken[0] != name:
            raise KeyStoreError(f"that secret is already key {taken[0]!r}'s: give each key its own secret")
        if replace and self._conn.execute("SELECT 1 FROM keys WHERE name = ?", (name,)).fetchone():
            return self._replace(key), secret
        try:
            self._conn.execute(
                "INSERT INTO keys (name, digest, hint, families, models, rpm, tpm, max_concurrent, "
                "expires_at, created_at, mcp) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.name,
                    key.digest,
                    key.hint,
                    ",".join(key.families),
                    msgspec.json.encode(list(key.models)).decode(),
                    key.rpm,
                    key.tpm,
                    key.max_concurrent,
                    key.expires_at,
                    key.created_at,
                    msgspec.json.encode(list(key.mcp)).decode(),
                ),
            )
        except sqlite3.IntegrityError:
            raise KeyStoreError(
                f"a key named {name!r} exists — `blazar keys rotate {name}` gives it a new secret"
            ) from None
        return key, secret

    def _replace(self, key: Key) -> Key:
        """Give the existing key ``key.name`` everything of ``key`` but its creation time; a new
        secret counts as a rotation."""
        self._conn.execute(
            "UPDATE keys SET rotated_at = CASE WHEN digest != ? THEN ? ELSE rotated_at END, "
            "digest = ?, hint = ?, families = ?, models = ?, rpm = ?, tpm = ?, "
            "max_concurrent = ?, expires_at = ?, mcp = ? WHERE name = ?",
            (
                key.digest,
                key.created_at,
                key.digest,
                key.hint,
                ",".join(key.families),
                msgspec.json.encode(list(key.models)).decode(),
                key.rpm,
                key.tpm,
                key.max_concurrent,
                key.expires_at,
                msgspec.json.encode(list(key.mcp)).decode(),
                key.name,
            ),
        )
        return self.get(key.name)

    def rotate(self, name: str) -> tuple[Key, str]:
        """A new secret for ``name``; the old one stops working at once. Scopes and limits stay."""
        secret = new_secret()
        cur = self._conn.execute(
            "UPDATE keys SET digest = ?, hint = ?, rotated_at = ? WHERE name = ?",
            (digest_of(secret), secret[:8], time.time(), name),
        )
        if cur.rowcount == 0:
            raise KeyStoreError(f"no key named {name!r} — see `blazar keys list`")
        return self.get(name), secret

    def remove(self, name: str, *, force: bool = False) -> None:
        """Remove ``name``; the last key only with ``force`` (``LastKeyError`` otherwise): with
        no key left, auth is off. Checked and removed in one transaction."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            names = [r[0] for r in self._conn.execute("SELECT name FROM keys")]
            if name not in names:
                raise KeyStoreError(f"no key named {name!r} — see `blazar keys list`")
            if names == [name] and not force:
                raise LastKeyError(f"{name!r} is the last API key")
            self._conn.execute("DELETE FROM keys WHERE name = ?", (name,))
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")


def matches(key: Key, secret_digest: str) -> bool:
    """Constant-time confirmation that ``secret_digest`` is ``key``'s."""
    return hmac.compare_digest(key.digest, secret_digest)
