"""``blazar classify MODEL TEXT --labels a,b``: a decision (``POST /v1/systemone``) from the
command line. It goes through the daemon (started in the background when none runs), so the
model's engine is the daemon's, admitted and kept alive like any other."""

from __future__ import annotations

import sys
from typing import Annotated

from cyclopts import Parameter

from blazar.cli import app
from blazar.cli._common import Json, err, load_setup, print_json
from blazar.daemon.client import CliError, ensure_daemon


def _labels(text: str) -> list[str]:
    labels = [part.strip() for part in text.split(",")]
    if len(labels) < 2 or any(not label for label in labels):
        raise CliError("--labels needs two or more labels, comma-separated, none empty (e.g. safe,unsafe)")
    return labels


@app.command
def classify(
    model: str,
    text: str,
    *,
    labels: Annotated[str, Parameter(help="The labels to choose from, comma-separated.")],
    question: Annotated[str | None, Parameter(help="What to decide, added to the instruction.")] = None,
    json_: Json = False,
) -> None:
    """Classify TEXT with MODEL into one of --labels: print the winning label, then each
    label's score (the scores sum to 1)."""
    body: dict[str, object] = {"model": model, "input": text, "labels": _labels(labels)}
    if question is not None:
        body["question"] = question
    paths, config = load_setup()
    daemon, started = ensure_daemon(paths, config)
    if started:
        err.print(
            f"[dim]started a background daemon (pid {daemon.pid}) at {daemon.url}; `blazar stop` ends it[/]"
        )
    doc = daemon.post("/v1/systemone", body)
    if json_:
        print_json(doc)
        return
    scores: dict[str, float] = doc.get("scores") or {}
    width = max((len(label) for label in scores), default=0)
    lines = [str(doc["label"])]
    lines += [f"  {label:<{width}}  {score:.4f}" for label, score in scores.items()]
    sys.stdout.write("\n".join(lines) + "\n")
    err.print(f"[dim]method: {doc.get('method')}[/]")
