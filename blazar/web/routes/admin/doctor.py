"""``POST /api/model-doctor``: certify what a model really does, through the gateway.

The doctor is a durable job (``blazar/serve/jobs/doctor.py`` runs its probes): this
checks that the model is one it certifies and submits it; ``GET
/api/model-doctor/{model}`` reads the certificate it leaves.
"""

from __future__ import annotations

import msgspec
import trio
from quart import Response
from quart_trio import QuartTrio

from actors.certificates import read_certificate
from blazar.dialects._wire import decode_json
from blazar.errors import BlazarError
from blazar.serve.jobs.doctor import KIND, DoctorRequest, facts_of
from blazar.web.asgi.replies import app_runtime, json_response, read_body
from blazar.web.routes.admin.jobs import encode_job

__all__ = ["register"]


def register(app: QuartTrio) -> None:
    app.post("/api/model-doctor")(submit_doctor)
    app.get("/api/model-doctor/<path:name>")(get_certificate)


async def submit_doctor() -> Response:
    runtime = app_runtime()
    body = decode_json(await read_body(), DoctorRequest)
    facts = await facts_of(runtime, body.model)
    if facts.kind not in ("chat", "embedding"):
        raise BlazarError(
            "MODEL_KIND_MISMATCH",
            f"model '{facts.model}' is a {facts.kind} model: the doctor certifies chat and embedding models",
        )
    job = await runtime.jobs.submit(
        KIND, msgspec.json.encode(DoctorRequest(model=facts.model)), model=facts.model
    )
    return json_response({**encode_job(job), "url": f"/v1/jobs/{job.id}"}, status=202)


async def get_certificate(name: str) -> Response:
    runtime = app_runtime()
    record = await trio.to_thread.run_sync(runtime.store.get, name)
    cert = await trio.to_thread.run_sync(read_certificate, runtime.ledger.path, record.name)
    if cert is None:
        raise BlazarError(
            "NOT_FOUND",
            f"model '{record.name}' has no certificate yet — run `blazar model-doctor {record.name}`",
        )
    return json_response(msgspec.to_builtins(cert))
