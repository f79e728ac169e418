"""``blazar quantize``: a smaller copy of a GGUF model in the store, checked by a real engine
on request."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, err, human_size, load_setup, open_store, out, print_json
from blazar.daemon.client import CliError

_DEFAULT_MAX_DEGRADATION = 10.0


@app.command
def quantize(
    model: str,
    type_: str,
    *,
    name: Annotated[
        str | None, Parameter(help="The new model's name (default: MODEL with the type, `m-q8_0`).")
    ] = None,
    imatrix: Annotated[
        Path | None, Parameter(help="An importance matrix (llama-imatrix's output): llama-quantize only.")
    ] = None,
    verify: Annotated[
        bool,
        Parameter(
            negative="", help="Measure perplexity before and after with the engine; drop a bad result."
        ),
    ] = False,
    max_degradation: Annotated[
        float | None,
        Parameter(help="With --verify: the most the perplexity may rise, in percent (default 10)."),
    ] = None,
    text: Annotated[
        Path | None,
        Parameter(help="With --verify: a UTF-8 text file to measure over (default: a built-in passage)."),
    ] = None,
    allow_requantize: Annotated[
        bool, Parameter(negative="", help="Quantize a model whose weights are quantized already.")
    ] = False,
    json_: Json = False,
) -> None:
    """Write MODEL (an f16, bf16 or f32 GGUF in the store) again in TYPE (Q8_0, Q4_K_M…) as a
    new model: `llama-quantize` writes it where installed (on PATH, or named by
    BLAZAR_LLAMA_QUANTIZE); without it Q8_0, Q5_1, Q5_0, Q4_1, Q4_0, BF16, F16 and F32 are
    written by Blazar itself.

    With --verify, the original and the result are each started in the engine and their
    perplexity over a built-in text is measured; a result whose perplexity rises more than
    --max-degradation percent is removed again."""
    if (max_degradation is not None or text is not None) and not verify:
        raise CliError("--max-degradation and --text go with --verify: give --verify too")
    limit = _DEFAULT_MAX_DEGRADATION if max_degradation is None else max_degradation
    if limit < 0:
        raise CliError("--max-degradation is a percentage: give 0 or more")
    words = _read_text(text) if text is not None else None
    paths, config = load_setup()
    store = open_store(paths)
    record = _write(store, model, type_, name=name, imatrix=imatrix, allow=allow_requantize, quiet=json_)
    source = store.get(model)
    if not json_:
        out.print(
            f"quantized {source.name} ({human_size(source.size)}) to {type_.upper()}: {record.name} "
            f"({human_size(record.size)}, {record.digest[:19]})",
            markup=False,
        )
    if not verify:
        if json_:
            print_json(record)
        return
    import trio

    from actors.errors import QuantizeDegraded
    from actors.quality import PASSAGE
    from actors.quality import verify as measure

    if not json_:
        out.print(f"measuring perplexity of {source.name} and {record.name} with the engine…", markup=False)
    runtime = config.runtime(paths)
    verdict = trio.run(lambda: measure(runtime, source.name, record.name, limit, text=words or PASSAGE))
    if json_:
        print_json({"model": record, "verify": verdict})
    else:
        b, a = verdict.before, verdict.after
        out.print(f"  perplexity before: {b.perplexity:.3f} ({b.model}, {b.tokens} tokens)", markup=False)
        out.print(f"  perplexity after:  {a.perplexity:.3f} ({a.model})", markup=False)
        out.print(f"  degradation: {verdict.degradation_pct:+.2f}% (limit {limit:g}%)", markup=False)
    if not verdict.kept:
        raise QuantizeDegraded(
            f"{record.name} degrades the perplexity by {verdict.degradation_pct:.2f}%, more than the "
            f"{limit:g}% --max-degradation allows: it was not kept — try a larger type (Q8_0, Q5_1…), "
            "an importance matrix (--imatrix, with llama-quantize), or a higher limit"
        )
    if not json_:
        out.print(f"kept {record.name}", markup=False)


def _read_text(path: Path) -> str:
    try:
        words = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path} as UTF-8 text: {getattr(exc, 'strerror', None) or exc}") from None
    if len(words) < 20:
        raise CliError(f"{path} holds too little text to measure a perplexity over: give a paragraph or more")
    return words


def _write(
    store: Any, model: str, kind: str, *, name: str | None, imatrix: Path | None, allow: bool, quiet: bool
) -> Any:
    """The new model, written with a progress bar of its tensors (none under --json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from registry.quantize import quantize_model

    if quiet:
        return quantize_model(store, model, kind, name=name, imatrix=imatrix, allow_requantize=allow)
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"quantizing {model} to {kind.upper()}", total=None)

        def tick(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return quantize_model(
            store, model, kind, name=name, imatrix=imatrix, allow_requantize=allow, on_progress=tick
        )
