"""The ``blazar_code`` catalog and the error envelope of each dialect.

Codes are additive: a shipped code keeps its HTTP status and meaning forever.
The catalog is served at ``GET /api/errors``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import msgspec

__all__ = [
    "CATALOG",
    "BlazarError",
    "CodeInfo",
    "Dialect",
    "error_body",
    "prompt_too_long",
    "status_code_for",
]


class Dialect(enum.StrEnum):
    OPENAI = "openai"
    OLLAMA = "ollama"
    ANTHROPIC = "anthropic"


class CodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    status: int
    meaning: str


def _c(code: str, status: int, meaning: str) -> CodeInfo:
    return CodeInfo(code=code, status=status, meaning=meaning)


CATALOG: dict[str, CodeInfo] = {
    c.code: c
    for c in (
        _c(
            "MODEL_NOT_FOUND", 404, "The model is not installed: run `blazar pull NAME` or see `blazar list`."
        ),
        _c("MODEL_UNSUPPORTED_ENGINE", 400, "No engine lane can serve this model's format."),
        _c(
            "MODEL_KIND_MISMATCH",
            400,
            "The model is of another kind than the route serves (a speech model sent to chat): "
            "the message names its kind and the route to use.",
        ),
        _c("MODEL_LOAD_TIMEOUT", 503, "The engine did not become healthy in time: check `blazar logs`."),
        _c("ENGINE_CIRCUIT_OPEN", 503, "The engine crashed repeatedly and is paused: check `blazar logs`."),
        _c("ALL_SLOTS_BUSY", 503, "Every slot stayed busy for the whole bounded wait: retry later."),
        _c("MODEL_TOO_LARGE", 503, "The model cannot fit on this machine even when nothing else is loaded."),
        _c("INSUFFICIENT_MEMORY", 507, "Not enough free memory right now: unload other models."),
        _c("ENGINE_CRASHED", 502, "The engine process failed; the next request starts it again."),
        _c(
            "ENGINE_STOPPED",
            503,
            "The daemon stopped the engine during the request (unload, reload, shutdown): send it again.",
        ),
        _c("INTERNAL", 500, "A bug in Blazar: report it with the x-blazar-trace-id."),
        _c("PROMPT_TOO_LONG", 400, "The prompt exceeds the context: shorten it or raise the context."),
        _c("UNAUTHORIZED", 401, "Missing or invalid API key."),
        _c("HOST_FORBIDDEN", 403, "The Host header is not a loopback name (DNS-rebinding guard)."),
        _c("RATE_LIMITED", 429, "Too many requests: wait for Retry-After."),
        _c("BAD_REQUEST", 400, "The request is malformed: the message names the field."),
        _c("INVALID_JSON", 400, "The body is not valid JSON."),
        _c("NOT_FOUND", 404, "No such route or object."),
        _c("METHOD_NOT_ALLOWED", 405, "The route exists but not with this HTTP method."),
        _c("PAYLOAD_TOO_LARGE", 413, "The request body exceeds the size limit."),
        _c("UNPROCESSABLE", 422, "The request is well-formed but cannot be processed."),
        _c("CLIENT_CLOSED_REQUEST", 499, "The request was cancelled before anything was sent."),
        _c("BAD_GATEWAY", 502, "The upstream engine answered with an error."),
        _c("UNAVAILABLE", 503, "The service is temporarily unavailable."),
        _c("GATEWAY_TIMEOUT", 504, "The upstream engine did not answer in time."),
        _c("INSUFFICIENT_STORAGE", 507, "Not enough disk space."),
        _c(
            "DISK_FULL",
            507,
            "A write found the disk full: the message says what and where; free space on the disk "
            "holding the data dir, then retry.",
        ),
        _c("QUEUE_FULL", 429, "The model's queue is full: retry after Retry-After seconds."),
        _c(
            "QUEUE_TIMEOUT",
            408,
            "The request waited longer than its class's queue_timeout_s for a slot: retry later.",
        ),
        _c(
            "CLASS_NOT_ALLOWED",
            403,
            "The API key may not ask for this request class (X-Blazar-Class or X-Blazar-Priority).",
        ),
        _c(
            "PREEMPTED",
            503,
            "The request gave its slot to an interactive one and could not queue again: send it again.",
        ),
        _c("DEADLINE_UNMEETABLE", 429, "The predicted wait exceeds X-Blazar-Deadline-Ms: retry later."),
        _c(
            "DEADLINE_EXCEEDED",
            429,
            "The deadline passed before the request was answered.",
        ),
        _c("SHUTTING_DOWN", 503, "The daemon is shutting down and admits no new work."),
        _c(
            "MAX_LOADED_MODELS",
            503,
            "Every loaded model is busy and max_loaded_models is reached: retry later.",
        ),
        _c("MODEL_EXISTS", 409, "A model of that name exists: pick another name or remove it first."),
        _c("MODEL_BUSY", 409, "The model is serving requests: wait or unload it, then retry."),
        _c("SESSION_NOT_FOUND", 404, "No saved session has this name: see `blazar session list`."),
        _c(
            "SESSION_MODEL_MISMATCH",
            409,
            "The session was saved from other weights (another model or digest): it cannot be restored.",
        ),
        _c(
            "SESSION_UNSUPPORTED",
            400,
            "The model's engine cannot save or restore slots (only llama.cpp chat engines can).",
        ),
        _c(
            "SESSION_EMPTY",
            409,
            "No slot of the model holds a prompt to save (not loaded, or nothing served yet): send it "
            "a request, then save.",
        ),
        _c(
            "SESSION_FAILED",
            502,
            "The engine refused or failed the slot save or restore: the message says why.",
        ),
        _c("LOCAL_ONLY", 403, "Refused by design: nothing leaves this machine (e.g. pushing a model)."),
        _c("VISION_PROJECTOR_MISSING", 400, "Images need a model with a vision projector."),
        _c(
            "CAPABILITY_VERIFIED_FAILED",
            400,
            "The model's certificate (`blazar model-doctor`) shows it FAILS a capability the request "
            "needs: see `blazar scorecard`, use another model, or set "
            "[admission] trust_certificates = false.",
        ),
        _c(
            "CONFIG_INVALID",
            422,
            "config.toml does not load (a key, a type or a value is wrong): fix it; nothing was changed.",
        ),
        _c(
            "MODEL_FILE_INCOMPLETE",
            422,
            "The model file is shorter than its header says (a download that stopped): re-download it.",
        ),
        _c(
            "QUANTIZE_TOOL_MISSING",
            501,
            "The quantization type (or --imatrix) needs llama.cpp's `llama-quantize`, which is not "
            "installed: install it, or pick a type Blazar writes itself (`blazar quantize --help`).",
        ),
        _c(
            "ALREADY_QUANTIZED",
            400,
            "The model's weights are already quantized: quantize its f16/bf16/f32 original, or pass "
            "--allow-requantize.",
        ),
        _c("QUANTIZE_FAILED", 422, "llama-quantize failed on the model: the message gives its last words."),
        _c(
            "QUANTIZE_DEGRADED",
            422,
            "The quantized model's perplexity rose more than --max-degradation allows: it was not kept.",
        ),
        _c(
            "LORA_INVALID",
            400,
            "The file is not a LoRA adapter in GGUF form (general.type adapter, adapter.type lora).",
        ),
        _c(
            "LORA_MISMATCH",
            400,
            "The LoRA adapter was made for another base model (architecture or tensor shapes differ).",
        ),
        _c("LORA_NOT_FOUND", 404, "The model has no such LoRA adapter (or none): see `blazar lora list`."),
        _c(
            "CONTROL_VECTOR_INVALID",
            400,
            "The file is not a control vector in GGUF form (general.architecture controlvector, "
            "direction.N tensors of floats).",
        ),
        _c(
            "CONTROL_VECTOR_MISMATCH",
            400,
            "The control vector does not fit the model: its width or layer count differ from the model's, "
            "or the layer range is outside the model's layers.",
        ),
        _c(
            "CONTROL_VECTOR_NOT_FOUND",
            404,
            "The model has no control vector of that name: see `blazar control list`.",
        ),
        _c(
            "CONTROL_VECTOR_UNSUPPORTED",
            400,
            "The model's engine cannot apply control vectors: the message says which engine can.",
        ),
        _c("JOB_NOT_FOUND", 404, "No job has this id: see `blazar jobs` (finished jobs are pruned in time)."),
        _c("JOB_FINISHED", 409, "The job has already ended: there is nothing to cancel."),
        _c(
            "JOB_NO_RESULT",
            409,
            "The job has no result to fetch: it has not completed yet (poll it), it failed or was "
            "cancelled (its error says why), or its kind keeps its answer elsewhere.",
        ),
        _c("BATCH_FILE_INVALID", 400, "A batch input file line is malformed: the message names the line."),
        _c(
            "BATCH_ENDPOINT_MISMATCH",
            400,
            "A batch input line names another endpoint than the batch: one endpoint per batch.",
        ),
        _c("HEADERS_TOO_LARGE", 431, "The request head exceeds max_header_kb: send fewer, shorter headers."),
        _c(
            "TOO_MANY_CONNECTIONS",
            503,
            "The connection cap (in all, or for this address) is reached with a request on each: retry.",
        ),
        _c(
            "KEY_EXPIRED",
            401,
            "The API key has expired: ask the operator for a new one (`blazar keys add`).",
        ),
        _c(
            "KEY_SCOPE_FORBIDDEN",
            403,
            "The API key's scopes do not include this route family (chat, embeddings, audio, images, "
            "batch, metrics, admin).",
        ),
        _c("MODEL_NOT_IN_SCOPE", 403, "The API key's `models:` scopes do not include this model."),
        _c(
            "KEY_CONCURRENCY_LIMITED",
            429,
            "The API key already runs its `max_concurrent` requests: retry after Retry-After.",
        ),
        _c(
            "CONTEXT_TOO_LARGE",
            400,
            "The context asked for exceeds what the model can serve (strict mode): lower it or extend it.",
        ),
        _c(
            "PARAMETER_IGNORED",
            400,
            "Strict mode: a parameter would have no effect here; the message names it: leave it out.",
        ),
        _c(
            "PARAMETER_CHANGED",
            400,
            "Strict mode: a parameter would be lowered (an output limit above the context): send less.",
        ),
        _c(
            "NOT_IMPLEMENTED",
            501,
            "The route is in the dialect's API but Blazar does not serve it: the message says what to use.",
        ),
        _c(
            "MCP_SERVER_NOT_FOUND",
            404,
            "No [[mcp]] server of that name in config.toml: see `blazar mcp list` (docs/mcp.md).",
        ),
        _c(
            "MCP_SERVER_DENIED",
            403,
            "The API key's `mcp:` scopes do not allow the MCP server the request named (docs/mcp.md).",
        ),
        _c(
            "MCP_PROTOCOL_UNSUPPORTED",
            502,
            "The MCP server speaks none of the protocol versions Blazar does (2026-07-28, 2025-11-25, "
            "2025-06-18): the message names what it offered and what was tried (docs/mcp.md).",
        ),
        _c(
            "PEER_UNAVAILABLE",
            503,
            "The peer that would serve the model is down or failed before answering, and no other "
            "machine has the model: see `blazar peers` and `blazar route MODEL`.",
        ),
        _c(
            "RPC_WORKER_UNAVAILABLE",
            503,
            "An RPC worker the model is split over does not answer, and the model may not run "
            "without it: start `blazar rpc-worker` there, or see the model's rpc_fallback.",
        ),
        _c(
            "PEER_NOT_FOUND",
            404,
            "A `remote:PEER/MODEL` name names a peer that no [[remotes]] entry defines: see `blazar peers`.",
        ),
        _c(
            "PEER_FAILED",
            502,
            "The peer failed during the answer (its stream ended early): retry; see `blazar peers`.",
        ),
        _c(
            "FAILOVER_EXHAUSTED",
            503,
            "Every target of the failover chain failed or was skipped; the message names each one's reason.",
        ),
        _c(
            "FAILOVER_CHAIN_NOT_FOUND",
            404,
            "No [[failover]] chain of that name in config.toml: see GET /api/failover (docs/routing.md).",
        ),
        _c(
            "CANDIDATES_NOT_STREAMED",
            400,
            "`n` above 1, `best_of` or a cascade needs whole answers to choose from: send it unstreamed.",
        ),
        _c(
            "CASCADE_NOT_FOUND",
            404,
            "No [[cascade]] of that name in config.toml: name one, or send `cascade` as a list of models.",
        ),
        _c(
            "MODEL_CANNOT_INFILL",
            400,
            "The model's vocabulary has no fill-in-the-middle tokens: use a code model trained for it.",
        ),
        _c(
            "MODEL_CANNOT_RERANK",
            400,
            "The model is not a reranker (its GGUF has no ranking head): rerank with a reranker model.",
        ),
        _c(
            "MODEL_IS_RERANKER",
            400,
            "The model is a reranker: it serves /v1/rerank only; embed or chat with another model.",
        ),
        _c(
            "IMAGE_INVALID",
            400,
            "An uploaded image is not a readable PNG, JPEG or WebP file, or its mask is not a PNG "
            "of the image's size: the message names the field.",
        ),
        _c(
            "IMAGE_FILE_NOT_FOUND",
            404,
            "No stored image has this id: image URLs expire after an hour or when the daemon restarts.",
        ),
        _c(
            "LATE_CHUNKING_TOO_LONG",
            413,
            "A late-chunked input has more tokens than late_chunking_max_tokens: send fewer chunks.",
        ),
        _c(
            "DECISION_NOT_STREAMED",
            400,
            "A decision (POST /v1/systemone) is answered whole: send it without `stream`.",
        ),
        _c(
            "MODEL_CANNOT_DECIDE",
            400,
            "The model's engine gives neither token probabilities nor constrained decoding, or not "
            "the one the request named: use a llama.cpp model, or another `method`.",
        ),
        _c(
            "STREAM_NOT_FOUND",
            404,
            "No resumable stream has this id for this key: it expired, was deleted, or is another key's.",
        ),
        _c(
            "STREAM_EVENTS_GONE",
            410,
            "The stream's events after the given Last-Event-ID are no longer kept (its size limit).",
        ),
        _c(
            "STREAM_CANCELLED",
            499,
            "A resumable stream was cancelled before its end: nobody read it within its grace, "
            "it was deleted, or the daemon stopped.",
        ),
        _c(
            "STREAM_STORE_FULL",
            503,
            "As many resumable streams as [streams] max_streams are live: retry later, or stream "
            "without X-Blazar-Resumable.",
        ),
        _c(
            "POLICY_REFUSED",
            403,
            "A policy hook ([[hooks]] in config.toml) refused the request or its answer: the message "
            "names the hook and gives its reason.",
        ),
        _c(
            "POLICY_HOOK_FAILED",
            503,
            "A policy hook that fails closed did not answer in time, failed, or answered no verdict: "
            "the request was not run (or its answer not given); retry later.",
        ),
    )
}

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


_OPENAI_CODES = {"PROMPT_TOO_LONG": "context_length_exceeded"}
"""OpenAI's own ``error.code`` where it has one for the same refusal: clients branch on it
(Codex, for one, tells the user the context is full only for this code)."""


def status_code_for(code: str) -> int:
    info = CATALOG.get(code)
    return info.status if info else 500


class BlazarError(Exception):
    """An error the gateway answers with; ``code`` is a catalog entry.

    ``wordings`` holds the message for the dialects whose own API refuses the same
    thing in words their clients match on; ``param`` names the request field to blame.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retry_after_s: float | None = None,
        param: str | None = None,
        wordings: Mapping[Dialect, str] | None = None,
    ) -> None:
        if code not in CATALOG:
            raise ValueError(f"unknown blazar_code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param
        self.wordings = dict(wordings or {})

    @property
    def status(self) -> int:
        return CATALOG[self.code].status

    def message_for(self, dialect: Dialect) -> str:
        return self.wordings.get(dialect, self.message)


CONTEXT_ADVICE = (
    'shorten it, or raise the context (Ollama `num_ctx`, or `ctx` under [models."NAME"] in config.toml)'
)


def prompt_too_long(n_prompt: int, n_ctx: int, *, advice: str = CONTEXT_ADVICE) -> BlazarError:
    """``PROMPT_TOO_LONG``: a prompt of ``n_prompt`` tokens for a context of ``n_ctx`` per slot.

    Anthropic's and OpenAI's clients recognise an overflow by their API's words (and
    read the counts from them), so those lead; the advice follows."""
    return BlazarError(
        "PROMPT_TOO_LONG",
        f"the prompt has {n_prompt} tokens but the context holds {n_ctx} per slot — {advice}",
        param="messages",
        wordings={
            Dialect.ANTHROPIC: f"prompt is too long: {n_prompt} tokens > {n_ctx} maximum — {advice}",
            Dialect.OPENAI: (
                f"This model's maximum context length is {n_ctx} tokens. However, your messages "
                f"resulted in {n_prompt} tokens. Please reduce the length of the messages — {advice}"
            ),
        },
    )


def error_body(dialect: Dialect, code: str, message: str, *, param: str | None = None) -> dict[str, object]:
    """The JSON error object in the caller's dialect (always with ``blazar_code``).

    ``param`` names the request field to blame; OpenAI's shape carries it (its SDK
    exposes it as ``error.param``), the others say it in the message."""
    status = status_code_for(code)
    match dialect:
        case Dialect.ANTHROPIC:
            kind = _ANTHROPIC_TYPES.get(status, "api_error")
            return {
                "type": "error",
                "error": {"type": kind, "message": message, "blazar_code": code},
                "blazar_code": code,
            }
        case Dialect.OLLAMA:
            return {"error": message, "blazar_code": code}
        case _:
            error: dict[str, object] = {
                "message": message,
                "type": _OPENAI_TYPES.get(status, "blazar_error"),
                "code": _OPENAI_CODES.get(code, code.lower()),
                "blazar_code": code,
            }
            if param is not None:
                error["param"] = param
            return {"error": error}
