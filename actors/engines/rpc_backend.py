"""llama.cpp's RPC backend for the xllamacpp wheel, and where ``make rpc-server`` keeps it.

The wheel is built without ``GGML_RPC``: ``llama_supports_rpc()`` is false and its
parameters name no RPC servers. Its ggml registry is open, though: the library exports
``ggml_backend_load`` and ``ggml_backend_register``. So the RPC client, built from the very
llama.cpp sources that the wheel's sdist vendors as a loadable backend module
(``libggml-rpc.so``, ``-DGGML_BACKEND_DL=ON``), is loaded into the host process before the
server starts; each worker then becomes one of its devices (``RPC0``, ``RPC1``…), placed
first by llama.cpp's own device order, exactly as ``llama-server --rpc`` does.

``scripts/build_rpc_server.py`` builds that module and ``ggml-rpc-server`` (the worker side)
from one source, so their wire protocol matches, into
``${XDG_CACHE_HOME:-~/.cache}/blazar/rpc-server/xllamacpp-<version>/``. The module must
come from the wheel's own version (its structs cross the boundary), so everything here is
keyed by it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

__all__ = [
    "MODULE",
    "SERVER",
    "RpcAttachError",
    "attach",
    "build_dir",
    "cache_root",
    "cached_module",
    "cached_server",
    "missing_module",
    "name_lost_workers",
    "watch_workers",
    "wheel_version",
]

SERVER = "ggml-rpc-server"
"""The worker binary's name in the cache (llama.cpp's own name for it since it was renamed)."""
MODULE = "client/libggml-rpc.so"
"""The RPC client as a ggml backend module, loaded into the wheel's process; in a folder of
its own (with the ``libggml-base.so.0`` it links), because ``rpc-server`` loads every
``libggml-*.so`` beside it."""


class RpcAttachError(RuntimeError):
    """The RPC workers could not be made devices of this process."""


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/blazar/rpc-server``: one folder per source version."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "blazar" / "rpc-server"


def wheel_version() -> str | None:
    """The installed xllamacpp's version, or None without it."""
    try:
        return metadata.version("xllamacpp")
    except metadata.PackageNotFoundError:
        return None


def build_dir(version: str) -> Path:
    """Where the build from xllamacpp ``version``'s sources lives."""
    return cache_root() / f"xllamacpp-{version}"


def cached_server(version: str | None = None) -> str | None:
    """The cached ``ggml-rpc-server`` built from the installed wheel's sources (or
    ``version``'s), or None when it has not been built."""
    version = version or wheel_version()
    if version is None:
        return None
    path = build_dir(version) / SERVER
    return str(path) if os.access(path, os.X_OK) else None


def cached_module(version: str) -> Path | None:
    path = build_dir(version) / MODULE
    return path if path.is_file() else None


def missing_module(version: str | None) -> str | None:
    """Why the wheel (xllamacpp ``version``) cannot reach RPC workers here, or None."""
    if version is None:
        return "xllamacpp is not installed"
    if cached_module(version) is None:
        return (
            f"llama.cpp's RPC backend for xllamacpp {version} is not built here (the wheel has none of "
            f"its own): run `make rpc-server` (scripts/build_rpc_server.py --version {version}), which "
            f"builds it into the user's cache (blazar/rpc-server/xllamacpp-{version})"
        )
    return None


def _reachable(server: str, timeout_s: float) -> str | None:
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return f"cannot reach the RPC worker {server}: {exc}"


def attach(servers: list[str], library: str, module: Path, *, timeout_s: float = 10.0) -> list[str]:
    """Load ``module`` into the already loaded wheel ``library`` (its path) and add each of
    ``servers`` (``host:port``) as a device; returns the devices' names. A worker that does
    not answer is an ``RpcAttachError`` before llama.cpp is asked (which would abort)."""
    for server in servers:
        if problem := _reachable(server, timeout_s):
            raise RpcAttachError(problem)
    lib = ctypes.CDLL(library)  # the same handle as the imported extension: one ggml registry
    lib.ggml_backend_load.restype = ctypes.c_void_p
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    reg = lib.ggml_backend_load(str(module).encode())
    if not reg:
        raise RpcAttachError(f"ggml could not load the RPC backend {module} (built for another xllamacpp?)")
    address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise RpcAttachError(f"{module} has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    names: list[str] = []
    for server in servers:
        server_reg = add_server(server.encode())
        if not server_reg:
            raise RpcAttachError(f"the RPC worker {server} offers no device")
        lib.ggml_backend_register(server_reg)
        for i in range(lib.ggml_backend_reg_dev_count(server_reg)):
            names.append(lib.ggml_backend_dev_name(lib.ggml_backend_reg_dev_get(server_reg, i)).decode())
    return names


LOST = "error: --rpc: the RPC worker {workers} went away"
"""The host's last line when a worker's connection breaks (``name_lost_workers``); the daemon
reads the addresses back from it (``actors.rpc.lost_workers``)."""

_kept: list[object] = []
"""The abort callback, kept alive for as long as the process lives (ctypes does not)."""


def _addresses(server: str) -> set[tuple[str, int]]:
    host, _, port = server.rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return set()
    return {(str(info[4][0]), int(info[4][1])) for info in found}


def _connections(servers: list[str]) -> dict[int, str]:
    """This process's sockets connected to one of ``servers``: file descriptor → worker."""
    wanted = {address: server for server in servers for address in _addresses(server)}
    found: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(int(name))) as sock:
                peer = sock.getpeername()
        except (OSError, ValueError):
            continue
        if isinstance(peer, tuple) and (server := wanted.get((str(peer[0]), int(peer[1])))):
            found[int(name)] = server
    return found


def _gone(fd: int) -> bool:
    """Whether the peer of socket ``fd`` has closed or reset it (read without consuming)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _lost(servers: list[str]) -> list[str]:
    """Those of ``servers`` with no open connection from this process."""
    live = {server for fd, server in _connections(servers).items() if not _gone(fd)}
    return [server for server in servers if server not in live]


def watch_workers(servers: list[str], say: Callable[[str], None], *, interval_s: float = 0.5) -> None:
    """Once the model is loaded (its buffers on each worker keep a connection open): a thread
    that ends the process, saying which worker went away, as soon as one does, rather than at
    the next request that would need it. llama.cpp cannot go on without a device. A worker
    that holds nothing (no connection once loaded) is not watched."""
    held = [server for server in servers if server not in _lost(servers)]

    def watch() -> None:
        while held:
            time.sleep(interval_s)
            if gone := _lost(held):
                say(f"{LOST.format(workers=', '.join(gone))} (its connection closed)")
                os._exit(1)

    threading.Thread(target=watch, name="rpc-watch", daemon=True).start()


def name_lost_workers(servers: list[str], module: Path, say: Callable[[str], None]) -> None:
    """Once ``attach`` has connected: when the RPC client aborts the process (a worker that
    stops answering mid-computation is fatal to llama.cpp), ``say`` first which worker went
    away, so that the caller's error can name it.

    ggml's abort message has no address. The callback looks at this process's sockets when
    it runs: each worker that still answers has an open connection (the model's buffers on
    it keep one); a worker without one went away. The callback goes to the ``libggml-base``
    the module links (the RPC client's own), not to the wheel's."""
    base = ctypes.CDLL(str(module.parent / "libggml-base.so.0"))
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    def on_abort(message: bytes | None) -> None:
        text = (message or b"").decode(errors="replace").strip()
        if "RPC server" not in text:
            say(f"error: {text}")
            return
        gone = _lost(servers) or servers
        say(f"{LOST.format(workers=', '.join(gone))} ({text})")

    callback = callback_type(on_abort)
    _kept.append(callback)
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback.argtypes = [callback_type]
    base.ggml_set_abort_callback(callback)
