"""``blazar control``: add, list and remove a model's control (steering) vectors.

A vector is checked against its model from the headers alone (its width and layers), kept
as a blob in the model store and listed in the model's manifest. A request chooses vectors
and their strengths (``POST /v1/chat/completions/control``); nothing runs steered otherwise,
so adding or removing one changes no running engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, human_size, listing, open_store, out, print_json, time_ago
from blazar.config import resolve_paths

__all__ = ["control"]

control = cyclopts.App(
    name="control",
    help="Manage a model's control vectors (GGUF): chosen per request with `control_vectors`.",
)
app.command(control)


def _layers(layers: list[int]) -> str:
    return (
        f"{layers[0]}-{layers[-1]}"
        if layers == list(range(layers[0], layers[-1] + 1))
        else ",".join(map(str, layers))
    )


@control.command
def add(
    model: str,
    vector: Path,
    *,
    name: Annotated[str | None, Parameter(help="Its name (default: the file's, without .gguf).")] = None,
    link: Annotated[bool, Parameter(negative="", help="Symlink the file instead of hardlink/copy.")] = False,
    json_: Json = False,
) -> None:
    """Add VECTOR (a control vector in GGUF form, as llama-cvector-generator writes it) to MODEL,
    after checking that it fits the model's width and layers.

    A vector of the same name is replaced."""
    from registry.control import add_vector

    record, added = add_vector(open_store(resolve_paths()), model, vector, name=name, link=link)
    if json_:
        print_json({"model": record.name, "vector": added})
        return
    out.print(
        f"added control vector {added.name} (layers {_layers(added.layers)}, width {added.width}, "
        f"{human_size(added.size)}) to {record.name}: name it in a request's control_vectors",
        markup=False,
    )


@control.command(name="list")
def list_(model: str | None = None, *, json_: Json = False) -> None:
    """List the control vectors of MODEL (of every model without one)."""
    store = open_store(resolve_paths())
    records = [store.get(model)] if model else [r for r in store.list() if r.control_vectors]
    if json_:
        print_json([{"model": r.name, "control_vectors": r.control_vectors} for r in records])
        return
    rows = [
        (
            r.name,
            v.name,
            _layers(v.layers),
            str(v.width),
            v.model_hint or "-",
            human_size(v.size),
            time_ago(v.added_at),
        )
        for r in records
        for v in r.control_vectors
    ]
    if rows:
        headers = ("MODEL", "NAME", "LAYERS", "WIDTH", "HINT", "SIZE", "ADDED")
        out.print(listing(headers, rows, whole=("MODEL", "NAME"), drop=("HINT", "ADDED")))
    elif model:
        out.print(f"{model} has no control vectors; add one with `blazar control add {model} FILE.gguf`")
    else:
        out.print("no model has control vectors; add one with `blazar control add MODEL FILE.gguf`")


@control.command
def rm(model: str, name: str) -> None:
    """Remove control vector NAME from MODEL (its blob goes when nothing else uses it). An engine
    already running steered by it keeps it until it stops; new requests cannot name it."""
    from registry.control import remove_vector

    record, removed = remove_vector(open_store(resolve_paths()), model, name)
    out.print(f"removed control vector {removed.name} from {record.name}", markup=False)
