"""Admission by certificate: a request that needs what the model was seen to fail is refused.

``blazar model-doctor`` stores, per model, which capabilities passed through the gateway.
A request that needs one the newest certificate marks FAIL (tools, a JSON schema, images,
thinking, embeddings) gets a 400 CAPABILITY_VERIFIED_FAILED naming the capability and the
certificate's evidence, before anything loads, instead of an answer that silently ignores
what was asked. ``[admission] trust_certificates = false`` (or per model
``trust_certificate``) turns this off; a model never certified is never refused here.

The doctor's own probes must reach the engine whatever the last certificate said: they
carry ``x-blazar-certifying`` and are made with the daemon's local token, and only that
pair skips the check.
"""

from __future__ import annotations

from actors.certificates import CertificateBook, Probe
from actors.config import RuntimeConfig
from actors.runtime import Runtime
from blazar.dialects.neutral import ChatRequest
from blazar.errors import BlazarError
from blazar.serve.context import Ask

__all__ = ["CERTIFYING", "chat_needs", "check", "refuse_failed"]

CERTIFYING = "x-blazar-certifying"
"""The header the doctor's probes carry (honoured only with the local token)."""

_WHAT = {
    "tools": "tool calls",
    "json_schema": "JSON-constrained answers (response_format / format)",
    "vision": "images",
    "thinking": "thinking",
    "embeddings": "embeddings",
}


def chat_needs(req: ChatRequest) -> list[str]:
    """The certified capabilities a chat request relies on."""
    needs = []
    if req.tools and (req.tool_choice is None or req.tool_choice.mode != "none"):
        needs.append("tools")
    if req.response_format is not None and req.response_format.kind != "text":
        needs.append("json_schema")
    if any(m.images for m in req.messages):
        needs.append("vision")
    if req.think:
        needs.append("thinking")
    return needs


def check(
    config: RuntimeConfig, book: CertificateBook, model: str, needs: list[str], *, certifying: bool = False
) -> None:
    """Raise CAPABILITY_VERIFIED_FAILED when ``model``'s certificate in ``book`` fails one of
    ``needs`` and the config trusts certificates; ``certifying``: the doctor's own probe."""
    if not needs or certifying:
        return
    override = config.models.get(model)
    trusted = config.admission.trust_certificates
    if override is not None and override.trust_certificate is not None:
        trusted = override.trust_certificate
    if not trusted:
        return
    for capability in needs:
        probe = book.failed(model, capability)
        if probe is not None:
            raise BlazarError("CAPABILITY_VERIFIED_FAILED", _message(book, model, probe))


def refuse_failed(runtime: Runtime, model: str, needs: list[str], ask: Ask) -> None:
    """``check`` for a request (``ask``) served on ``runtime``."""
    if needs:
        check(runtime.config, runtime.certificates, model, needs, certifying=ask.certifying)


def _message(book: CertificateBook, model: str, probe: Probe) -> str:
    cert = book.get(model)
    engine = f" on {cert.engine}" if cert is not None else ""
    evidence = probe.answer.replace("\n", " ")
    if len(evidence) > 160:
        evidence = evidence[:159] + "…"
    return (
        f"model '{model}' failed the {probe.capability} check of its certificate{engine}: "
        f"{_WHAT.get(probe.capability, probe.capability)} would not be honoured ({probe.detail}; "
        f"answer: {evidence or '(empty)'}) — use another model, re-certify with "
        f"`blazar model-doctor {model}`, or send it anyway with [admission] trust_certificates = false "
        f'(or [models."{model}"] trust_certificate = false)'
    )
