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
