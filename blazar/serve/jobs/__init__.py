"""The durable job kinds the gateway adds to the runtime: one table, one ``register_all``.

``JOB_KINDS`` names every kind whose runner lives above the runtime, what it runs and
what its runner is made from; ``register_all`` registers them all on ``runtime.jobs``
(``blazar.web.app.build_gateway`` calls it once). The ``pull`` kind is not in the table:
the runtime registers it itself (``actors/pulls.py``, in ``open_runtime``), so an embedder
pulls models without the gateway.

A runner takes plain values from the gateway, never the HTTP layer itself: its ASGI
application as a callable (batch items and transcriptions *are* requests, run through it
on purpose: same auth, validation and error shapes), the local token's headers, where a
background response's facts are recorded, and the ``SelfLink`` to the daemon's own port
(the doctor, the benchmark and the tune measure what a client gets).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from actors.jobs import Runner
from actors.runtime import Runtime
from blazar.serve.jobs import background, batch_runner, bench, doctor, speech, tune, video
from blazar.serve.jobs.background import Record
from blazar.serve.jobs.in_process import ASGIApp
from blazar.serve.jobs.self_link import SelfLink

__all__ = ["JOB_KINDS", "JobKind", "Wiring", "register_all"]


@dataclass(frozen=True, kw_only=True)
class Wiring:
    """What the gateway hands its job runners (see ``register_all``)."""

    app: ASGIApp
    headers: Mapping[str, str]
    link: SelfLink
    record: Record | None = None


class JobKind(NamedTuple):
    kind: str
    """The kind's name, as ``/v1/jobs`` shows it."""
    runs: str
    """What a job of the kind runs, and what submits one."""
    make: Callable[[Runtime, Wiring], Runner]
    """The kind's runner, made from the runtime and what the gateway hands over."""


JOB_KINDS: tuple[JobKind, ...] = (
    JobKind(
        background.KIND,
        "a background response (POST /v1/responses with background: true)",
        lambda rt, w: background.runner(rt, record=w.record),
    ),
    JobKind(
        batch_runner.KIND,
        "a batch (/v1/batches, /v1/messages/batches): each item through the gateway's ASGI app",
        lambda rt, w: batch_runner.runner(rt, w.app, headers=w.headers),
    ),
    JobKind(
        speech.KIND,
        "an async transcription or translation (async=true): through the gateway's ASGI app",
        lambda rt, w: speech.runner(rt, w.app, headers=w.headers),
    ),
    JobKind(
        video.KIND,
        "a video (POST /v1/videos): sd-server's native video job under a low-tier claim",
        lambda rt, w: video.runner(rt),
    ),
    JobKind(
        doctor.KIND,
        "the model doctor's probes (POST /api/model-doctor), over the daemon's own port",
        lambda rt, w: doctor.runner(rt, w.link),
    ),
    JobKind(
        bench.KIND,
        "a benchmark (POST /api/bench), over the daemon's own port",
        lambda rt, w: bench.runner(rt, w.link),
    ),
    JobKind(
        tune.KIND,
        "a tune (POST /api/tune): a benchmark per trial of launch settings",
        lambda rt, w: tune.runner(rt, w.link),
    ),
)
"""Every job kind the gateway adds, in the order they are registered."""


def register_all(
    runtime: Runtime,
    *,
    app: ASGIApp,
    headers: Mapping[str, str],
    link: SelfLink,
    record: Record | None = None,
) -> None:
    """Register every kind of ``JOB_KINDS`` on ``runtime.jobs``; queued jobs of a kind start
    once it is registered.

    ``app``: the daemon's ASGI application, which batch items and transcription jobs are
    sent to in-process; ``headers``: the local token's, on each of those requests (so that
    an item may act as the key that made it); ``link``: the daemon's own port, which the
    doctor, bench and tune call as clients (its address is set once the server listens);
    ``record``: where a background response's facts go once it has run (the gateway's
    ledger and telemetry).
    """
    wiring = Wiring(app=app, headers=headers, link=link, record=record)
    for entry in JOB_KINDS:
        runtime.jobs.register(entry.kind, entry.make(runtime, wiring))
