"""``blazar rpc-worker``: lend this machine's memory to a model split with llama.cpp's RPC
backend, and the split's table for ``blazar fit`` and ``blazar plan``."""

from __future__ import annotations

import signal
from typing import Any

from rich.markup import escape
from rich.table import Table

from blazar.cli import app
from blazar.cli._common import err, load_setup, out
from blazar.daemon.client import CliError


def _bin(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def print_split(split: dict[str, Any]) -> None:
    """The parts of a split (``registry.split.RpcSplit`` as JSON) and the flags it gives."""
    table = Table("PART", "LAYERS", "HOLDS", "HAS", "HEADROOM", box=None)
    for part in split["parts"]:
        first = part["first_layer"]
        count = part["layers"]
        layers = "-" if not count else str(first) if count == 1 else f"{first}-{first + count - 1}"
        if part["output"]:
            layers += " + output"
        table.add_row(
            escape(part["name"]),
            layers,
            _bin(part["bytes"]),
            _bin(part["available"]),
            _bin(part["headroom"]),
        )
    out.print(table)
    ts = ",".join(str(n) for n in split["tensor_split"])
    verdict = "fits" if split["verdict"] == "fits" else "does not fit"
    out.print(f"[bold]split[/]  {verdict}: -ngl {split['gpu_layers']} --tensor-split {ts}")
    for note in split["notes"]:
        out.print(f"[dim]note: {escape(note)}[/]")


@app.command(name="rpc-worker")
def rpc_worker(
    *,
    host: str = "127.0.0.1",
    port: int = 50052,
    mem: int | None = None,
    threads: int | None = None,
    device: str | None = None,
    cache: bool = False,
    i_know_rpc_is_unauthenticated: bool = False,
) -> None:
    """Serve this machine's memory (and GPU) to a model split over several machines: runs
    llama.cpp's rpc-server, restarting it if it crashes, until interrupted.

    On the main machine, list this worker in the model's table of config.toml:
    rpc = ["THIS-HOST:PORT"] and rpc_memory_mb = [MiB]. --host defaults to loopback:
    rpc-server has no authentication, so any other address is refused unless
    --i-know-rpc-is-unauthenticated is given (on a trusted network only).
    --mem (MiB) caps what an older rpc-server advertises; --device picks one ggml device
    (CUDA0…); --cache keeps received tensors in llama.cpp's cache directory."""
    import trio

    from actors.rpc import (
        NOT_FOUND,
        REFUSED_BIND,
        UNSAFE_BIND,
        WorkerOptions,
        find_rpc_server,
        is_loopback,
        run_worker,
        takes_mem,
        worker_argv,
    )

    if not 1 <= port <= 65535:
        raise CliError(f"--port {port} is not a TCP port (1-65535)")
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not is_loopback(host) and not i_know_rpc_is_unauthenticated:
        raise CliError(REFUSED_BIND.format(address=address))
    _, config = load_setup()
    binary = find_rpc_server(config.engine.rpc_server)
    if binary is None:
        raise CliError(NOT_FOUND)
    options = WorkerOptions(host=host, port=port, mem_mb=mem, threads=threads, device=device, cache=cache)
    try:
        argv = worker_argv(binary, options, mem_flag=mem is not None and takes_mem(binary))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not is_loopback(host):
        err.print(f"[bold yellow]warning:[/] {UNSAFE_BIND.format(address=address)}")
    err.print(f'rpc-worker: {binary} on {address}; on the main machine: rpc = ["{address}"]')

    def say(line: str) -> None:
        err.print(f"rpc-worker: {line}")

    async def main() -> int:
        code = 0
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def serve() -> None:
                    nonlocal code
                    code = await run_worker(argv, say=say)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(serve)
                async for signum in signals:
                    say(f"{signal.Signals(signum).name}: stopping rpc-server")
                    nursery.cancel_scope.cancel()
                    break
        return code

    code = trio.run(main)
    if code:
        raise SystemExit(code)
