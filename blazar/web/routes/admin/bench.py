"""``POST /api/bench`` (``blazar bench``), ``GET /api/benchmarks`` and ``GET /api/scorecard/{model}``.

A benchmark is a durable job (``blazar/serve/jobs/bench.py`` runs it): this checks the
request and submits it, and lists the receipts it leaves.

The scorecard reads what is stored (receipts, the certificate) and the model's fit estimate;
it never runs anything, and says when what it shows predates the active engine version.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
from quart import Response, request
from quart_trio import QuartTrio

from actors.certificates import read_certificate, read_receipts
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.errors.describe import describe_error
from blazar.serve.jobs.bench import KIND, BenchRequest, active_engine
from blazar.web.asgi.replies import app_runtime, json_response, query_int, read_body
from blazar.web.routes.admin.jobs import encode_job

__all__ = ["register"]


def register(app: QuartTrio) -> None:
    app.post("/api/bench")(submit_bench)
    app.get("/api/benchmarks")(list_bench_receipts)
    app.get("/api/scorecard/<path:name>")(get_scorecard)


def _check(req: BenchRequest) -> None:
    if not req.concurrency or any(c < 1 or c > 256 for c in req.concurrency):
        raise BlazarError(
            "BAD_REQUEST", "concurrency must list levels between 1 and 256, e.g. 1,4,8", param="concurrency"
        )
    if req.ctx < 1 or req.ctx > 1_000_000:
        raise BlazarError("BAD_REQUEST", "ctx (prompt tokens) must be between 1 and 1000000", param="ctx")
    if req.requests is not None and not 1 <= req.requests <= 10_000:
        raise BlazarError("BAD_REQUEST", "requests must be between 1 and 10000", param="requests")
    if not 2 <= req.max_tokens <= 8192:
        raise BlazarError("BAD_REQUEST", "max_tokens must be between 2 and 8192", param="max_tokens")


async def submit_bench() -> Response:
    runtime = app_runtime()
    req = decode_json(await read_body(), BenchRequest)
    _check(req)
    record = await trio.to_thread.run_sync(runtime.store.get, req.model)
    if record.kind != "chat":
        raise BlazarError(
            "MODEL_KIND_MISMATCH",
            f"model '{record.name}' is a {record.kind} model: the benchmark runs chat models",
        )
    req = msgspec.structs.replace(req, model=record.name)
    job = await runtime.jobs.submit(KIND, msgspec.json.encode(req), model=record.name)
    return json_response({**encode_job(job), "url": f"/v1/jobs/{job.id}"}, status=202)


async def list_bench_receipts() -> Response:
    runtime = app_runtime()
    name = request.args.get("model")
    if name:
        name = (await trio.to_thread.run_sync(runtime.store.get, name)).name
    limit = query_int("limit", 50, 1000)
    receipts = await trio.to_thread.run_sync(lambda: read_receipts(runtime.ledger.path, name, limit=limit))
    return json_response({"object": "list", "data": msgspec.to_builtins(receipts)})


async def get_scorecard(name: str) -> Response:
    runtime = app_runtime()
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    model = record.name
    active, _ = await active_engine(runtime, model)
    path = runtime.ledger.path
    cert = await trio.to_thread.run_sync(read_certificate, path, model)
    receipts = await trio.to_thread.run_sync(lambda: read_receipts(path, model, limit=1))
    memory: dict[str, Any] = {}
    try:
        plan = await runtime.plan(model)
    except Exception as exc:  # an engine version not installed: the page still shows what is stored
        described = describe_error(exc)
        if described is None:
            raise
        memory["refused"] = described.message
    else:
        memory |= {"need_bytes": plan.preview.need_bytes, "budget_bytes": plan.preview.budget_bytes}
        if (est := plan.estimate) is not None:
            memory |= {
                "weights_bytes": est.weights,
                "kv_bytes": est.kv,
                "compute_bytes": est.compute,
                "total_bytes": est.total,
            }
        memory |= {"slots": plan.slots, "ctx_per_slot": plan.ctx_per_slot, "refused": plan.preview.refused}
    doc: dict[str, Any] = {
        "model": model,
        "engine": active,
        "memory": memory,
        "certificate": None,
        "receipt": None,
    }
    if cert is not None:
        doc["certificate"] = {
            "engine": cert.engine,
            "created_at": cert.created_at,
            "stale": cert.engine != active,
            "capabilities": cert.summary(),
        }
    if receipts:
        r = receipts[0]
        doc["receipt"] = {
            "id": r.id,
            "engine": r.engine,
            "created_at": r.created_at,
            "stale": r.engine != active,
            "settings": r.settings,
            "levels": r.levels,
        }
    return json_response(doc)
