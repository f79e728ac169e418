"""The OpenAI wire shapes of the mistral.rs host, and their mapping onto the wheel's requests.

Sans-io and free of the wheel: ``chat_options``/``completion_options`` turn a request
body into the keyword arguments of ``mistralrs.ChatCompletionRequest`` /
``CompletionRequest`` (or raise ``RequestError``, a 400), and the ``*_json`` helpers
turn what the wheel returns (read by attribute) into OpenAI-shaped dicts.

Besides OpenAI's fields it takes the llama.cpp extensions the gateway relays where
the wheel has them (``repeat_penalty``, ``ignore_eos``, ``dry_*``, an llguidance
``grammar``, ``json_schema``); request fields that change nothing here
(``cache_prompt``, ``id_slot``, ``return_progress``…) are ignored. What the wheel
cannot do is refused by name, never dropped: ``n`` > 1 (batched sequences fail on
its CPU GGUF path), log-probabilities, tool definitions (the gateway emulates
tools), a per-request ``seed`` while sampling (the wheel seeds once per process),
image parts, ``suffix``, ``best_of`` and llama.cpp's other samplers.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

__all__ = [
    "COMPLETION_MAX_TOKENS",
    "ChatBody",
    "CompletionBody",
    "RequestError",
    "chat_chunk_json",
    "chat_options",
    "chat_response_json",
    "completion_options",
    "completion_response_json",
    "decode_chat",
    "decode_completion",
    "error_json",
    "timings_json",
    "usage_json",
]

COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions`` (chat has none)."""


class RequestError(Exception):
    """A request the host refuses: HTTP 400 with OpenAI's error shape."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _unsupported(param: str, why: str) -> RequestError:
    # OpenAI's wording for a parameter a model does not take, and why this engine does not.
    return RequestError(
        f"Unsupported parameter: '{param}' is not supported with this model: {why}",
        param=param,
        code="unsupported_parameter",
    )


class Part(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[Part] | None = None
    tool_calls: list[Any] | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class JsonSchema(msgspec.Struct, kw_only=True):
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: JsonSchema | None = None


class _Sampling(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # llama.cpp's extensions (the gateway relays them) that the wheel has too.
    repeat_penalty: float | None = None
    ignore_eos: bool = False
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_sequence_breakers: list[str] | None = None
    # ... and those it has not: refused when they would change the output.
    mirostat: int | None = None
    dynatemp_range: float | None = None
    xtc_probability: float | None = None
    top_n_sigma: float | None = None
    n_probs: int | None = None
    samplers: Any = None
    chat_template_kwargs: dict[str, Any] | None = None


class ChatBody(_Sampling, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: ResponseFormat | None = None


class CompletionBody(_Sampling, kw_only=True):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


def _decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise RequestError(f"invalid request body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


def decode_chat(body: bytes) -> ChatBody:
    result: ChatBody = _decode(body, ChatBody)
    return result


def decode_completion(body: bytes) -> CompletionBody:
    result: CompletionBody = _decode(body, CompletionBody)
    return result


def _sampling(req: _Sampling, max_tokens: int | None) -> dict[str, Any]:
    if req.n is not None and req.n != 1:
        raise _unsupported("n", "this engine generates one choice per request")
    if req.seed is not None and req.temperature != 0:
        raise _unsupported(
            "seed", "the mistral.rs engine seeds once per process; use temperature 0 for repeatable output"
        )
    if max_tokens is not None and max_tokens < 1:
        raise RequestError("max_tokens must be at least 1", param="max_tokens")
    if req.temperature is not None and req.temperature < 0:
        raise RequestError("temperature must not be negative", param="temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise RequestError("top_p must be in (0, 1]", param="top_p")
    for name in ("mirostat", "dynatemp_range", "xtc_probability", "top_n_sigma", "n_probs"):
        if getattr(req, name) not in (None, 0):
            raise _unsupported(name, "the mistral.rs engine has no such sampler")
    if req.samplers is not None:
        raise _unsupported("samplers", "the mistral.rs engine applies its samplers in its own order")
    if req.chat_template_kwargs:
        raise _unsupported("chat_template_kwargs", "the mistral.rs engine takes no template arguments")
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty
        if req.repetition_penalty is not None
        else req.repeat_penalty,
        "stop_seqs": [s for s in stop if s] or None,
        "ignore_eos": req.ignore_eos or None,
        "dry_multiplier": req.dry_multiplier,
        "dry_base": req.dry_base,
        "dry_allowed_length": req.dry_allowed_length,
        "dry_sequence_breakers": req.dry_sequence_breakers,
    }
    if req.grammar is not None and req.json_schema is not None:
        raise RequestError("give either grammar or json_schema, not both", param="grammar")
    if req.grammar:
        # llama.cpp's llguidance grammars ("%llguidance {}" then Lark rules) are the wheel's "lark".
        out["grammar"], out["grammar_type"] = req.grammar, "lark"
    elif req.json_schema is not None:
        out["grammar"], out["grammar_type"] = msgspec.json.encode(req.json_schema).decode(), "json_schema"
    if req.logit_bias:
        try:
            out["logit_bias"] = {int(k): float(v) for k, v in req.logit_bias.items()}
        except ValueError as exc:
            raise RequestError("logit_bias keys must be token ids", param="logit_bias") from exc
    return {k: v for k, v in out.items() if v is not None}


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _messages(messages: list[Message]) -> list[dict[str, str]]:
    if not messages:
        raise RequestError("messages must not be empty", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = _ROLES.get(m.role)
        if role is None:
            if m.role in ("tool", "function"):
                raise _unsupported(f"messages[{i}].role", "tool results need the gateway's tool emulation")
            raise RequestError(f"unknown role '{m.role}' in messages[{i}]", param=f"messages[{i}].role")
        if m.tool_calls:
            raise _unsupported(f"messages[{i}].tool_calls", "tool calls need the gateway's tool emulation")
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if part.type != "text" or part.text is None:
                    raise _unsupported(
                        f"messages[{i}].content", f"'{part.type}' parts (this model reads text)"
                    )
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = m.content or ""
        out.append({"role": role, "content": content})
    return out


def chat_options(req: ChatBody) -> dict[str, Any]:
    """Keyword arguments for ``mistralrs.ChatCompletionRequest`` (without model and stream)."""
    if req.logprobs or req.top_logprobs:
        raise _unsupported("logprobs", "this engine host does not return log-probabilities")
    if req.tools and req.tool_choice != "none":
        raise _unsupported("tools", "this lane has no native tool calling; the gateway emulates it")
    out = _sampling(
        req, req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    out["messages"] = _messages(req.messages)
    fmt = req.response_format
    if fmt is not None and fmt.type != "text" and "grammar" in out:
        raise RequestError("give either response_format or a grammar, not both", param="response_format")
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            schema: dict[str, Any] = {"type": "object"}
        elif fmt.type == "json_schema" and fmt.json_schema is not None and fmt.json_schema.schema is not None:
            schema = fmt.json_schema.schema
        else:
            raise RequestError(
                "response_format must be text, json_object, or json_schema with a schema",
                param="response_format",
            )
        out["grammar"] = msgspec.json.encode(schema).decode()
        out["grammar_type"] = "json_schema"
    return out


def completion_options(req: CompletionBody) -> dict[str, Any]:
    """Keyword arguments for ``mistralrs.CompletionRequest`` (without model)."""
    if req.logprobs:
        raise _unsupported("logprobs", "this engine host does not return log-probabilities")
    if req.suffix:
        raise _unsupported("suffix", "the mistral.rs engine does not insert text")
    if req.best_of is not None and req.best_of != 1:
        raise _unsupported("best_of", "this engine generates one choice per request")
    if isinstance(req.prompt, list):
        if len(req.prompt) != 1:
            raise _unsupported("prompt", "one prompt per request")
        prompt = req.prompt[0]
    else:
        prompt = req.prompt
    out = _sampling(req, req.max_tokens if req.max_tokens is not None else COMPLETION_MAX_TOKENS)
    out["prompt"] = prompt
    if req.echo:
        out["echo_prompt"] = True
    return out


# -- responses --------------------------------------------------------------

_FINISH = {"stop", "length", "tool_calls", "content_filter"}


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish reasons; the wheel's others (``canceled``, ``eos``…) read as ``stop``."""
    if reason is None:
        return None
    return reason if reason in _FINISH else "stop"


def usage_json(usage: Any) -> dict[str, int]:
    return {
        "prompt_tokens": int(usage.prompt_tokens),
        "completion_tokens": int(usage.completion_tokens),
        "total_tokens": int(usage.total_tokens),
    }


def timings_json(usage: Any) -> dict[str, float | int]:
    """llama-server's ``timings`` from the wheel's usage: the gateway reads prefill and
    decode time from it, whatever the lane."""
    prompt_ms = float(usage.total_prompt_time_sec) * 1000.0
    predicted_ms = float(usage.total_completion_time_sec) * 1000.0
    out: dict[str, float | int] = {
        "prompt_n": int(usage.prompt_tokens),
        "prompt_ms": round(prompt_ms, 3),
        "predicted_n": int(usage.completion_tokens),
        "predicted_ms": round(predicted_ms, 3),
    }
    if prompt_ms > 0:
        out["prompt_per_second"] = round(usage.prompt_tokens * 1000.0 / prompt_ms, 3)
    if predicted_ms > 0:
        out["predicted_per_second"] = round(usage.completion_tokens * 1000.0 / predicted_ms, 3)
    return out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_response_json(
    *, rid: str, model: str, content: str, finish: str | None, usage: Any
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish_reason(finish) or "stop",
            }
        ],
        "usage": usage_json(usage) if usage is not None else None,
        "timings": timings_json(usage) if usage is not None else None,
    }


def chat_chunk_json(
    *,
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: Any = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; with ``usage`` and no delta, the usage chunk (no choices)."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
    }
    if delta is not None:
        chunk["choices"] = [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason(finish)}
        ]
    if usage is not None:
        chunk["usage"] = usage_json(usage)
        chunk["timings"] = timings_json(usage)
    return chunk


def completion_response_json(
    *, rid: str, model: str, text: str, finish: str | None, usage: Any, obj: str = "text_completion"
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(finish)}],
    }
    if usage is not None:
        out["usage"] = usage_json(usage)
        out["timings"] = timings_json(usage)
    return out


def error_json(message: str, *, kind: str, code: int | str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
