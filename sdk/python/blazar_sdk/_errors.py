"""One exception for every failure, with the daemon's ``blazar_code`` when it sent one."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

__all__ = ["BlazarError", "error_from_body", "error_from_event"]

# Codes the SDK itself uses when no daemon answer carries one. They start with ``SDK_`` so
# that they can never be mistaken for one of the daemon's catalog codes (``GET /api/errors``).
SDK_CONNECTION = "SDK_CONNECTION"
SDK_TIMEOUT = "SDK_TIMEOUT"
SDK_BAD_RESPONSE = "SDK_BAD_RESPONSE"
SDK_STREAM_CUT = "SDK_STREAM_CUT"
SDK_MISSING_EXTRA = "SDK_MISSING_EXTRA"


class BlazarError(Exception):
    """A request that failed.

    ``blazar_code`` is the daemon's stable code (``MODEL_NOT_FOUND``, ``PROMPT_TOO_LONG``, …)
    or one of the SDK's own (``SDK_CONNECTION``, ``SDK_TIMEOUT``, ``SDK_BAD_RESPONSE``,
    ``SDK_STREAM_CUT``, ``SDK_MISSING_EXTRA``). ``status`` is the HTTP status of the answer;
    it is ``None`` when there was no answer, and for an error event inside a stream that had
    already started with 200.
    """

    def __init__(
        self,
        message: str,
        *,
        blazar_code: str,
        status: Optional[int] = None,
        type: Optional[str] = None,
        param: Optional[str] = None,
        retry_after_s: Optional[float] = None,
        trace_id: Optional[str] = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.blazar_code = blazar_code
        self.status = status
        self.type = type
        self.param = param
        self.retry_after_s = retry_after_s
        self.trace_id = trace_id
        self.body = body

    def __str__(self) -> str:
        where = f"{self.status} " if self.status is not None else ""
        return f"{where}{self.blazar_code}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"BlazarError(status={self.status!r}, blazar_code={self.blazar_code!r}, message={self.message!r})"
        )


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _fields(doc: Any) -> Dict[str, Any]:
    """The error's fields out of any of the daemon's three envelopes.

    OpenAI: ``{"error": {"message", "type", "code", "blazar_code", "param"}}``; Anthropic:
    ``{"type": "error", "error": {"type", "message", "blazar_code"}}``; Ollama:
    ``{"error": "…", "blazar_code": "…"}``."""
    if not isinstance(doc, dict):
        return {}
    err = doc.get("error")
    if isinstance(err, dict):
        return {
            "message": err.get("message"),
            "blazar_code": err.get("blazar_code") or doc.get("blazar_code"),
            "type": err.get("type"),
            "param": err.get("param"),
            "code": err.get("code"),
        }
    if isinstance(err, str):
        return {"message": err, "blazar_code": doc.get("blazar_code")}
    return {}


def error_from_body(status: int, raw: bytes, headers: Mapping[str, str]) -> BlazarError:
    """The error an HTTP answer with ``status`` >= 400 stands for."""
    text = raw.decode("utf-8", "replace")
    try:
        doc: Any = json.loads(text) if text else None
    except ValueError:
        doc = None
    fields = _fields(doc)
    code = fields.get("blazar_code")
    if not isinstance(code, str) or not code:
        # An answer without a code (an engine's own body relayed, a proxy in between): the
        # status alone is known, so say it in the message rather than invent a code.
        code = SDK_BAD_RESPONSE
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        message = text.strip()[:500] or f"HTTP {status} with an empty body"
    return BlazarError(
        message,
        blazar_code=code,
        status=status,
        type=fields.get("type"),
        param=fields.get("param"),
        retry_after_s=_retry_after(headers),
        trace_id=headers.get("x-blazar-trace-id"),
        body=doc if doc is not None else text,
    )


def error_from_event(doc: Any, trace_id: Optional[str] = None) -> Optional[BlazarError]:
    """The error an event inside a stream carries (an OpenAI ``data: {"error": …}``, an
    Ollama ``{"error": …}`` line, a Responses ``error`` event), or None for any other event."""
    if not isinstance(doc, dict):
        return None
    if doc.get("type") == "error" and "error" not in doc and isinstance(doc.get("message"), str):
        code = doc.get("code")
        return BlazarError(
            doc["message"],
            blazar_code=code if isinstance(code, str) and code else SDK_BAD_RESPONSE,
            param=doc.get("param"),
            trace_id=trace_id,
            body=doc,
        )
    if "error" not in doc:
        return None
    fields = _fields(doc)
    message = fields.get("message") or "the stream failed"
    code = fields.get("blazar_code") or SDK_BAD_RESPONSE
    return BlazarError(
        str(message),
        blazar_code=str(code),
        type=fields.get("type"),
        param=fields.get("param"),
        trace_id=trace_id,
        body=doc,
    )
