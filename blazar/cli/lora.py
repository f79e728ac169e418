"""``blazar lora``: add, list and remove a model's LoRA adapters.

An adapter is checked against its model from the headers alone (architecture,
adapted weights and their shapes), kept as a blob in the model store and listed
in the model's manifest. A running daemon restarts the model's engine with it once
the engine's requests have finished; otherwise the next start loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, human_size, listing, open_store, out, print_json, time_ago
from blazar.config import Paths, resolve_paths
from blazar.daemon.client import find_daemon

__all__ = ["lora"]

lora = cyclopts.App(
    name="lora",
    help="Manage a model's LoRA adapters (GGUF): loaded with it, chosen per request with `lora`.",
)
app.command(lora)


def _reload(paths: Paths, model: str) -> str:
    """Tell a running daemon; what happens, in words."""
    daemon = find_daemon(paths)
    if daemon is None:
        return "it loads with the model's next start"
    if daemon.post(f"/admin/models/{model}/adapters").get("reloading"):
        return "the running engine restarts with it once its requests finish"
    return "it loads with the model's next start"


@lora.command
def add(
    model: str,
    adapter: Path,
    *,
    scale: Annotated[float, Parameter(help="The scale it starts with (a request may pick another).")] = 1.0,
    name: Annotated[str | None, Parameter(help="Its name (default: the file's, without .gguf).")] = None,
    link: Annotated[bool, Parameter(negative="", help="Symlink the file instead of hardlink/copy.")] = False,
    json_: Json = False,
) -> None:
    """Add ADAPTER (a LoRA adapter in GGUF form) to MODEL, after checking that it was made for it.

    An adapter of the same name is replaced."""
    from registry.adapters import add_adapter

    paths = resolve_paths()
    record, added = add_adapter(open_store(paths), model, adapter, name=name, scale=scale, link=link)
    what = _reload(paths, record.name)
    if json_:
        print_json({"model": record.name, "adapter": added, "id": record.adapters.index(added)})
        return
    number = record.adapters.index(added)
    out.print(
        f"added LoRA adapter {added.name} (id {number}, scale {added.scale:g}, {human_size(added.size)}) "
        f"to {record.name}: {what}",
        markup=False,
    )


@lora.command(name="list")
def list_(model: str | None = None, *, json_: Json = False) -> None:
    """List the LoRA adapters of MODEL (of every model without one); ID is what a request's
    `lora` names beside the adapter's name."""
    store = open_store(resolve_paths())
    records = [store.get(model)] if model else [r for r in store.list() if r.adapters]
    if json_:
        print_json([{"model": r.name, "adapters": r.adapters} for r in records])
        return
    rows = []
    for r in records:
        for i, a in enumerate(r.adapters):
            alpha = f"{a.alpha:g}" if a.alpha is not None else "-"
            rows.append((
                r.name, str(i), a.name, f"{a.scale:g}", str(a.rank or "-"), alpha, human_size(a.size),
                time_ago(a.added_at),
            ))  # fmt: skip
    if rows:
        headers = ("MODEL", "ID", "NAME", "SCALE", "RANK", "ALPHA", "SIZE", "ADDED")
        out.print(listing(headers, rows, whole=("MODEL", "ID", "NAME"), drop=("ALPHA", "RANK", "ADDED")))
    elif model:
        out.print(f"{model} has no LoRA adapters; add one with `blazar lora add {model} FILE.gguf`")
    else:
        out.print("no model has LoRA adapters; add one with `blazar lora add MODEL FILE.gguf`")


@lora.command
def rm(model: str, name: str) -> None:
    """Remove adapter NAME from MODEL (its blob goes when nothing else uses it)."""
    from registry.adapters import remove_adapter

    paths = resolve_paths()
    record, removed = remove_adapter(open_store(paths), model, name)
    what = _reload(paths, record.name).replace("it loads", "the model starts without it")
    what = what.replace("restarts with it", "restarts without it")
    out.print(f"removed LoRA adapter {removed.name} from {record.name}: {what}", markup=False)
