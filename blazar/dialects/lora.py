"""A request's choice of LoRA adapters: the ``lora`` field, checked against the model's.

llama.cpp takes ``"lora": [{"id": 0, "scale": 0.5}]`` on its chat and completion
routes: the adapters it lists are applied at those scales for this request alone,
and the model's other adapters are off (scale 0) for it. We take the same field on
the OpenAI routes (the SDK's ``extra_body``) and as ``options.lora`` on Ollama's,
and also accept an adapter by its name (``{"name": "pirate", "scale": 1}``), as
``blazar lora list`` shows it; a name is turned into the engine's number here.
Unknown adapters, bad scales and models without adapters are refused (400 /
404), never passed on for the engine to turn into an opaque error. Sans-io.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from blazar.errors import BlazarError

__all__ = ["MAX_SCALE", "choose", "in_body"]

MAX_SCALE = 10.0
"""The largest scale (either sign) a request may give an adapter."""


class _Choice(msgspec.Struct, forbid_unknown_fields=True):
    scale: float = 1.0
    id: int | None = None
    name: str | None = None


class _Doc(msgspec.Struct):
    lora: list[_Choice] | None = None


_DECODER = msgspec.json.Decoder(_Doc)


def choose(value: Any, adapters: Sequence[str], *, model: str, param: str = "lora") -> list[dict[str, Any]]:
    """The engine's ``lora`` list for a request's ``value``, given the model's adapter names in
    the engine's order; ``BlazarError`` naming what is wrong."""
    try:
        choices = msgspec.convert(value, list[_Choice])
    except msgspec.ValidationError as exc:
        raise BlazarError(
            "BAD_REQUEST",
            f'invalid field `{param}`: {exc} — give a list like [{{"name": "ADAPTER", "scale": 0.5}}] '
            'or [{"id": 0, "scale": 0.5}]',
            param=param,
        ) from None
    if not adapters:
        raise BlazarError(
            "LORA_NOT_FOUND",
            f"`{param}` asks for LoRA adapters, and model '{model}' has none — add one with "
            f"`blazar lora add {model} FILE.gguf`, or drop `{param}`",
            param=param,
        )
    out: dict[int, float] = {}
    for c in choices:
        if (c.id is None) == (c.name is None):
            raise BlazarError(
                "BAD_REQUEST",
                f"invalid field `{param}`: each entry names an adapter by `id` or by `name`",
                param=param,
            )
        index = c.id if c.id is not None else (adapters.index(c.name) if c.name in adapters else -1)
        if not 0 <= index < len(adapters):
            have = ", ".join(f"{i}: {n}" for i, n in enumerate(adapters))
            which = c.name if c.name is not None else c.id
            raise BlazarError(
                "LORA_NOT_FOUND",
                f"model '{model}' has no LoRA adapter {which!r} (it has {have}) — "
                f"see `blazar lora list {model}`",
                param=param,
            )
        if not -MAX_SCALE <= c.scale <= MAX_SCALE:
            raise BlazarError(
                "BAD_REQUEST",
                f"invalid field `{param}`: scale {c.scale} is out of range [-{MAX_SCALE:g}, {MAX_SCALE:g}]",
                param=param,
            )
        out[index] = c.scale
    return [{"id": i, "scale": s} for i, s in sorted(out.items())]


def in_body(body: bytes, adapters: Sequence[str], *, model: str) -> bytes:
    """``body`` (a relayed OpenAI request) with its ``lora`` checked and given as the engine's
    numbers; returned unchanged (not parsed) when it has none."""
    if b'"lora"' not in body:
        return body
    try:
        doc = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BlazarError("BAD_REQUEST", f"invalid field `lora`: {exc}", param="lora") from None
    if doc.lora is None:
        return body
    chosen = choose(msgspec.to_builtins(doc.lora), adapters, model=model)
    whole = msgspec.json.decode(body)
    whole["lora"] = chosen
    return msgspec.json.encode(whole)
