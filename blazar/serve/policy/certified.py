"""What a request needs certified, and the doctor's exemption.

The refusal itself is the runtime's (``actors/preflight.py``): a request that needs a
capability the model's newest certificate marks FAIL gets a 400
``CAPABILITY_VERIFIED_FAILED`` before anything loads. This says which capabilities a chat
request relies on. The doctor's own probes must reach the engine whatever the last
certificate said: they carry ``x-blazar-certifying`` and are made with the daemon's local
token, and only that pair skips the check.
"""

from __future__ import annotations

from actors.preflight import check_certificates
from actors.runtime import Runtime
from blazar.dialects.neutral import ChatRequest
from blazar.serve.context import Ask

__all__ = ["CERTIFYING", "chat_needs", "refuse_failed"]

CERTIFYING = "x-blazar-certifying"
"""The header the doctor's probes carry (honoured only with the local token)."""


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


def refuse_failed(runtime: Runtime, model: str, needs: list[str], ask: Ask) -> None:
    """The certificate check for a request (``ask``) served on ``runtime``, ahead of its claim
    (which checks again on the engine it gets: a chain's target may differ)."""
    if needs:
        check_certificates(runtime.config, runtime.certificates, model, needs, certifying=ask.certifying)
