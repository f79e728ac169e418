"""``POST /api/tune`` (``blazar tune``) and ``GET``/``DELETE /api/profiles/{model}``.

A tune is a durable job (``blazar/serve/jobs/tune.py`` runs it, and searches): this checks
the request and submits it, one tune of a model at a time, and reads or drops the profile
it leaves.
"""

from __future__ import annotations

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.jobs import read_jobs
from actors.ledger import Write
from actors.profiles import delete_statement, read_profile
from actors.reload import apply_profile
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.serve.jobs.tune import KIND, TuneRequest
from blazar.web.asgi.replies import app_runtime, json_response, read_body
from blazar.web.routes.admin.jobs import encode_job

__all__ = ["register"]


def register(app: QuartTrio) -> None:
    app.post("/api/tune")(submit_tune)
    app.get("/api/profiles/<path:name>")(get_profile)
    app.delete("/api/profiles/<path:name>")(delete_profile)


def _check(req: TuneRequest) -> None:
    if not 1 <= req.concurrency <= 64:
        raise BlazarError("BAD_REQUEST", "concurrency must be between 1 and 64", param="concurrency")
    if not 16 <= req.ctx <= 100_000:
        raise BlazarError("BAD_REQUEST", "ctx (prompt tokens) must be between 16 and 100000", param="ctx")
    if not 2 <= req.max_tokens <= 4096:
        raise BlazarError("BAD_REQUEST", "max_tokens must be between 2 and 4096", param="max_tokens")
    if req.requests is not None and not 1 <= req.requests <= 1000:
        raise BlazarError("BAD_REQUEST", "requests must be between 1 and 1000", param="requests")
    if not 1 <= req.budget <= 100:
        raise BlazarError("BAD_REQUEST", "budget must be between 1 and 100 trials", param="budget")
    if not 0 <= req.min_gain <= 1:
        raise BlazarError("BAD_REQUEST", "min_gain must be between 0 and 1 (0.05: 5 %)", param="min_gain")


async def submit_tune() -> Response:
    runtime = app_runtime()
    req = decode_json(await read_body(), TuneRequest)
    _check(req)
    record = await trio.to_thread.run_sync(runtime.store.get, req.model)
    if record.kind != "chat":
        raise BlazarError(
            "MODEL_KIND_MISMATCH", f"model '{record.name}' is a {record.kind} model: tune runs chat models"
        )
    req = msgspec.structs.replace(req, model=record.name)

    def under_way() -> list[str]:
        found = []
        for state in ("queued", "running"):
            jobs = read_jobs(runtime.jobs.path, state=state, kind=KIND, limit=1000)
            found += [j.id for j in jobs if j.model == record.name]
        return found

    if running := await trio.to_thread.run_sync(under_way):
        raise BlazarError(
            "MODEL_BUSY",
            f"a tune of '{record.name}' is already under way (job {running[0]}): wait for it, or "
            f"cancel it with `blazar jobs cancel {running[0]}`",
        )
    job = await runtime.jobs.submit(KIND, msgspec.json.encode(req), model=record.name)
    return json_response({**encode_job(job), "url": f"/v1/jobs/{job.id}"}, status=202)


async def get_profile(name: str) -> Response:
    runtime = app_runtime()
    model = (await trio.to_thread.run_sync(runtime.store.get, name)).name
    tuned = await trio.to_thread.run_sync(read_profile, runtime.ledger.path, model)
    if tuned is None:
        raise BlazarError("NOT_FOUND", f"model '{model}' has no tuned profile: run `blazar tune {model}`")
    return json_response(msgspec.to_builtins(tuned))


async def delete_profile(name: str) -> Response:
    runtime = app_runtime()
    model = (await trio.to_thread.run_sync(runtime.store.get, name)).name
    existed = await trio.to_thread.run_sync(read_profile, runtime.ledger.path, model) is not None
    await runtime.ledger.ask(Write(statements=(delete_statement(model),)))
    restarts = await apply_profile(runtime, model, None)
    return json_response({"model": model, "deleted": existed, "engine_restarts": restarts})
