"""Paths and ``config.toml``: strict (an unknown key is an error), typed with msgspec."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

import msgspec
import platformdirs

from actors.config import RuntimeConfig, Tunables

__all__ = [
    "HOOK_ROUTES",
    "Config",
    "ConfigError",
    "HookConfig",
    "Paths",
    "SemanticCacheConfig",
    "StreamsConfig",
    "configured_keys",
    "load_config",
    "parse_config",
    "resolve_paths",
]

DEFAULT_PORT = 11435


class ConfigError(Exception):
    pass


class Paths(msgspec.Struct, frozen=True, kw_only=True):
    config_file: str
    data_dir: str
    run_dir: str
    log_dir: str
    cache_dir: str

    @property
    def models_dir(self) -> str:
        return f"{self.data_dir}/models"

    @property
    def daemon_file(self) -> str:
        """Where a running daemon writes its pid, address and port."""
        return f"{self.run_dir}/daemon.json"

    @property
    def log_file(self) -> str:
        return f"{self.log_dir}/daemon.log"


def resolve_paths() -> Paths:
    """``BLAZAR_HOME`` moves everything below one directory; otherwise XDG paths."""
    cache = os.environ.get("BLAZAR_CACHE_DIR")
    home = os.environ.get("BLAZAR_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(
            config_file=str(root / "config.toml"),
            data_dir=str(root),
            run_dir=str(root / "run"),
            log_dir=str(root / "logs"),
            cache_dir=cache or str(root / "cache"),
        )
    state = Path(platformdirs.user_state_dir("blazar"))
    return Paths(
        config_file=str(Path(platformdirs.user_config_dir("blazar")) / "config.toml"),
        data_dir=platformdirs.user_data_dir("blazar"),
        run_dir=str(state / "run"),
        log_dir=str(state / "logs"),
        cache_dir=cache or platformdirs.user_cache_dir("blazar"),
    )


class StreamsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[streams]``: resumable streams, kept in memory (docs/api.md#resumable-streams)."""

    resumable: bool = False
    """Make every streamed answer resumable unless its request says ``X-Blazar-Resumable: off``."""
    grace_s: float = 30.0
    """How long a resumable stream's generation goes on with nobody reading before it is cancelled."""
    keep_s: float = 300.0
    """How long a finished stream is kept for a client to read again."""
    max_streams: int = 256
    """Streams kept at once, live and finished; past it the oldest finished one is dropped."""
    max_stream_kb: int = 1024
    """Bytes kept per stream, in KiB; past it its oldest events are dropped."""


class SemanticCacheConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[semantic_cache]``: answers kept in memory and given again to a request whose prompt
    means the same (docs/api.md#semantic-cache)."""

    enabled: bool = False
    """Look up every eligible chat request unless it says ``X-Blazar-Cache: off``; off, only
    those that say ``X-Blazar-Cache: on`` are."""
    model: str | None = None
    """The embedding model that compares prompts (any installed model llama.cpp can pool);
    none: the cache is off."""
    threshold: float = 0.95
    """The cosine similarity (0 to 1) at or above which a cached prompt counts as the same."""
    ttl_s: float = 300.0
    """How long an answer is kept and given again."""
    max_entries: int = 1024
    """Answers kept in all; past it the oldest is dropped."""


HOOK_ROUTES = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/completions",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
)
"""The routes policy hooks guard (a batch's items run through them)."""


class HookConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[hooks]]`` entry: a policy hook called before or after a chat request runs
    (docs/security.md#policy-hooks)."""

    name: str
    """Named in the X-Blazar-Policy header and in a refusal's message."""
    stage: Literal["pre", "post"]
    """``pre``: sees the request and may allow, refuse or rewrite it; ``post``: sees the answer
    and may allow, redact or refuse it."""
    url: str | None = None
    """An HTTP endpoint the hook's JSON is POSTed to."""
    entry: str | None = None
    """A Python callable ``module:function`` (sync or async) called with the same JSON."""
    timeout_ms: int = 1000
    """How long the hook may take; past it, ``on_error`` decides."""
    on_error: Literal["open", "closed"] = "closed"
    """A hook that fails (timeout, error, a verdict it cannot read): ``open`` lets the request
    run as if allowed; ``closed`` refuses it (503 POLICY_HOOK_FAILED)."""
    routes: list[str] = []
    """The routes it applies to (among ``HOOK_ROUTES``); empty: all of them."""
    models: list[str] = []
    """Model names (shell patterns: ``llama*``) it applies to; empty: all models."""
    buffer_streams: bool = False
    """A post hook on a streamed answer: hold the whole stream, call the hook, then release it.
    Off: post hooks do not see streams (the answer says so in X-Blazar-Warnings)."""


class Config(Tunables, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``config.toml``: the server's own keys here, the runtime's in ``Tunables``."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_body_mb: float = 50.0
    allowed_hosts: list[str] = []
    """Extra Host header names accepted on a loopback bind (beyond localhost names)."""
    log_max_mb: float = 10.0
    drain_grace_s: float = 10.0
    """On shutdown, how long requests in flight may run before engines are stopped."""
    otel_endpoint: str | None = None
    """OTLP/HTTP collector base URL (``/v1/traces`` is appended) to export request traces
    to; needs the ``[otel]`` extra. Unset: ``OTEL_EXPORTER_OTLP_ENDPOINT`` if set, else off."""
    otel_service_name: str = "blazar"
    audit_log: bool = False
    """Write one JSON line per request to ``logs/audit.jsonl`` (docs/observability.md)."""
    audit_max_mb: float = 50.0
    """Size at which the audit log is rotated."""
    audit_keep: int = 5
    """Rotated audit files kept (``audit.jsonl.1`` …)."""
    audit_prompts: bool = False
    """Also write each request's prompt and answer text to the audit log, scrubbed."""
    quantiles_window: int = 1000
    """``/api/quantiles``: the newest this many requests per model (warm and cold apart)…"""
    quantiles_window_s: float = 300.0
    """…of those, only the ones that ended in the last this many seconds."""
    # -- transport (docs/security.md) --
    tls_cert: str | None = None
    """PEM certificate (chain) file: with ``tls_key`` the daemon serves HTTPS (and HTTP/2)."""
    tls_key: str | None = None
    cors_origins: list[str] = []
    """Web origins granted cross-origin access (``"*"`` only if written); none: local origins only."""
    header_timeout_s: float = 10.0
    """How long a new connection may take to send its first request's headers."""
    keep_alive_timeout_s: float = 75.0
    """How long an idle keep-alive connection stays open between requests."""
    max_connections: int = 1024
    """Open client connections in all; past it a new connection is refused."""
    max_connections_per_client: int = 256
    """Open connections from one client address; past it a new one from there is refused."""
    max_header_kb: int = 64
    """Largest request head (request line and headers) accepted, in KiB: past it, 431."""
    workers: int = 1
    """HTTP data-plane processes: above 1, that many workers accept and relay the engines'
    streams while this process keeps the runtime (docs/architecture.md, "Several data-plane
    workers"). 1: one process, as always."""
    insecure_open: bool = False
    """Serve a non-loopback address with no API key (anyone who reaches the port may do anything)."""
    key_concurrency: Literal["reject", "queue"] = "reject"
    """A key over its ``max_concurrent``: 429 at once, or wait for one of its requests to end."""
    # -- the realtime voice loop (docs/speech.md#realtime) --
    realtime_transcription_model: str | None = None
    """The speech-to-text model a realtime session starts with; None: the first installed."""
    realtime_voice: str | None = None
    """The voice (text-to-speech model) a realtime session starts with; None: the first installed."""
    streams: StreamsConfig = StreamsConfig()
    semantic_cache: SemanticCacheConfig = SemanticCacheConfig()
    hooks: list[HookConfig] = []
    """Policy hooks (``[[hooks]]`` entries), in the order they run; none: no policy work at all."""

    def runtime(self, paths: Paths) -> RuntimeConfig:
        tunables = {name: getattr(self, name) for name in Tunables.__struct_fields__}
        return RuntimeConfig(
            home=paths.data_dir,
            run_dir=paths.run_dir,
            cache_dir=paths.cache_dir,
            configured=configured_keys(paths),
            **tunables,
        )


def configured_keys(paths: Paths) -> frozenset[str]:
    """The runtime keys the config file sets: top-level ones and ``engine.KEY``."""
    try:
        doc = tomllib.loads(Path(paths.config_file).read_text())
    except (OSError, ValueError):
        return frozenset()
    keys = {k for k in doc if k in Tunables.__struct_fields__ and k not in ("engine", "models")}
    engine = doc.get("engine")
    if isinstance(engine, dict):
        keys |= {f"engine.{k}" for k in engine}
    return frozenset(keys)


def load_config(paths: Paths) -> Config:
    path = Path(paths.config_file)
    if not path.exists():
        return Config()
    return parse_config(path.read_bytes(), path)


def parse_config(data: bytes | str, path: Path) -> Config:
    """``data`` as a ``config.toml`` (named ``path`` in errors), checked as the daemon checks it."""
    try:
        config = msgspec.toml.decode(data, type=Config)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{path}: {exc} — fix the file or see docs/configuration.md") from exc
    if config.slots < 1:
        raise ConfigError(f"{path}: slots must be at least 1")
    if config.default_ctx < 256:
        raise ConfigError(f"{path}: default_ctx must be at least 256")
    if config.audit_max_mb <= 0 or config.audit_keep < 0:
        raise ConfigError(f"{path}: audit_max_mb must be positive and audit_keep 0 or more")
    if config.quantiles_window < 1 or config.quantiles_window_s <= 0:
        raise ConfigError(f"{path}: quantiles_window must be at least 1 and quantiles_window_s positive")
    if not 1 <= config.workers <= 64:
        raise ConfigError(f"{path}: workers must be between 1 and 64")
    if config.max_loaded_models < 0:
        raise ConfigError(f"{path}: max_loaded_models must be 0 (no limit) or more")
    _check_transport(path, config)
    streams = config.streams
    if streams.grace_s <= 0 or streams.keep_s <= 0 or streams.max_streams < 1 or streams.max_stream_kb < 1:
        raise ConfigError(
            f"{path}: [streams] grace_s and keep_s must be above 0, max_streams and max_stream_kb at least 1"
        )
    _check_semantic_cache(path, config.semantic_cache)
    _check_hooks(path, config.hooks)
    config = _read_remote_keys(path, config)
    for name, model in config.models.items():
        if model.rope_scale is not None and model.rope_scaling is None:
            raise ConfigError(
                f'{path}: [models."{name}"] rope_scale needs rope_scaling ("yarn" or "linear") beside it'
            )
    return config


def _check_semantic_cache(path: Path, cache: SemanticCacheConfig) -> None:
    if not 0.0 <= cache.threshold <= 1.0:
        raise ConfigError(f"{path}: [semantic_cache] threshold is a cosine similarity from 0 to 1")
    if cache.ttl_s <= 0 or cache.max_entries < 1:
        raise ConfigError(f"{path}: [semantic_cache] ttl_s must be above 0 and max_entries at least 1")
    if cache.enabled and not cache.model:
        raise ConfigError(
            f"{path}: [semantic_cache] enabled needs model = the embedding model that compares "
            'prompts (e.g. model = "nomic-embed-text"; docs/configuration.md)'
        )


def _check_hooks(path: Path, hooks: list[HookConfig]) -> None:
    seen: set[str] = set()
    for hook in hooks:
        where = f"{path}: [[hooks]] {hook.name!r}"
        if not hook.name or hook.name in seen:
            raise ConfigError(f"{where}: each hook needs a name of its own")
        seen.add(hook.name)
        if (hook.url is None) == (hook.entry is None):
            raise ConfigError(f'{where}: give exactly one of url = "http://…" or entry = "module:function"')
        if hook.url is not None and not hook.url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: url must start with http:// or https://")
        if hook.entry is not None:
            module, _, function = hook.entry.partition(":")
            if not module or not function.isidentifier():
                raise ConfigError(f'{where}: entry must be "module:function", e.g. "mypolicy:check"')
        if not 1 <= hook.timeout_ms <= 600_000:
            raise ConfigError(f"{where}: timeout_ms must be between 1 and 600000")
        if hook.buffer_streams and hook.stage == "pre":
            raise ConfigError(f"{where}: buffer_streams is for post hooks (a pre hook never sees a stream)")
        if unknown := [r for r in hook.routes if r not in HOOK_ROUTES]:
            raise ConfigError(
                f"{where}: routes {unknown} are not guarded by hooks; they guard {', '.join(HOOK_ROUTES)}"
            )


def _check_transport(path: Path, config: Config) -> None:
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError(f"{path}: tls_cert and tls_key go together — set both, or neither for plain HTTP")
    for key in ("tls_cert", "tls_key"):
        value = getattr(config, key)
        if value is not None and not Path(value).expanduser().is_file():
            raise ConfigError(
                f"{path}: {key} = {value!r} is not a readable file — give the path of a PEM file "
                "(see docs/security.md for making one)"
            )
    for origin in config.cors_origins:
        if origin != "*" and ("://" not in origin or origin.endswith("/")):
            raise ConfigError(
                f"{path}: cors_origins entry {origin!r} is not an origin — write scheme://host[:port] "
                'with no path, e.g. "https://app.example", or "*" for any origin'
            )
    if config.header_timeout_s <= 0 or config.keep_alive_timeout_s <= 0:
        raise ConfigError(f"{path}: header_timeout_s and keep_alive_timeout_s must be above 0")
    if config.max_connections < 1 or config.max_connections_per_client < 1:
        raise ConfigError(f"{path}: max_connections and max_connections_per_client must be at least 1")
    if config.max_header_kb < 1:
        raise ConfigError(f"{path}: max_header_kb must be at least 1")
    for remote in config.remotes:
        if remote.ca_file is not None and not Path(remote.ca_file).expanduser().is_file():
            raise ConfigError(
                f"{path}: [[remotes]] {remote.name!r}: ca_file = {remote.ca_file!r} is not a readable file "
                "— give the path of a PEM bundle (docs/federation.md)"
            )


def _read_remote_keys(path: Path, config: Config) -> Config:
    """Put each ``key_file``'s content in its remote's ``key`` (surrounding whitespace dropped,
    as a file written by ``echo`` or a Secret ends with a newline)."""
    if not any(r.key_file is not None for r in config.remotes):
        return config
    remotes = []
    for remote in config.remotes:
        if remote.key_file is not None:
            try:
                key = Path(remote.key_file).expanduser().read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"{path}: [[remotes]] {remote.name!r}: key_file = {remote.key_file!r} cannot be read "
                    f"({exc.__class__.__name__}) — give the path of a file that holds the key alone"
                ) from None
            if not key or any(c.isspace() for c in key):
                raise ConfigError(
                    f"{path}: [[remotes]] {remote.name!r}: key_file = {remote.key_file!r} holds no key "
                    "(it is empty, or more than one word) — write the key alone in it"
                )
            remote = msgspec.structs.replace(remote, key=key, key_file=None)
        remotes.append(remote)
    return msgspec.structs.replace(config, remotes=remotes)
