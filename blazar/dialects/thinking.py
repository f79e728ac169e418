"""Thinking control: what a request asks of a model's reasoning, and what llama.cpp is told.

Each dialect says it its own way (OpenAI ``reasoning_effort``, the Responses API's
``reasoning.effort``, Anthropic ``thinking`` and ``output_config.effort``, Ollama
``think``); decoded, a request carries ``think`` (on, off, or None for the model's
own default), a ``think_level`` and a ``think_budget`` in tokens. ``engine_fields``
turns them into llama.cpp's request fields for a model whose chat template can think:

* on/off → ``chat_template_kwargs.enable_thinking`` (a template with the switch);
* a budget → ``reasoning_budget_tokens``: llama.cpp ends the reasoning section there
  (it writes the closing tag itself) and the model goes on to answer;
* a level → ``chat_template_kwargs.reasoning_effort`` where the template reads it
  (gpt-oss), else a budget (``LEVEL_BUDGETS``).

``unheeded`` names what a model cannot do (no thinking in its template, or thinking
it cannot turn off): the response reports it as ignored, strict mode refuses it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from blazar.dialects.neutral import ChatRequest, DecodeError

__all__ = [
    "LEVELS",
    "LEVEL_BUDGETS",
    "engine_fields",
    "fields_into_body",
    "level",
    "unheeded",
]

LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""Every effort level a dialect names; ``none`` turns thinking off."""

LEVEL_BUDGETS = {"minimal": 128, "low": 512, "medium": 2048}
"""The reasoning budget (tokens) a level becomes where the template reads no level;
``high``, ``xhigh`` and ``max`` leave the reasoning uncut."""

_TEMPLATE_LEVEL = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                   "max": "high"}  # fmt: skip
"""The level a template that reads ``reasoning_effort`` gets (gpt-oss knows low to high)."""


def level(value: str, param: str) -> tuple[bool, str | None]:
    """``(think, level)`` for an effort level named in a request (``param`` names the field);
    ``none`` turns thinking off."""
    if value not in LEVELS:
        raise DecodeError(
            f"invalid field `{param}`: {value!r} is not one of {', '.join(LEVELS)}", param=param
        )
    return (False, None) if value == "none" else (True, value)


def unheeded(req: ChatRequest, *, support: str) -> list[str]:
    """The request's thinking parameter when the model cannot do what it asks: think on a
    model whose template cannot (``support`` ``none``), or not think on one that always does."""
    if req.think is None:
        return []
    if support == "none" and req.think:
        return [req.think_param]
    if support == "always" and not req.think:
        return [req.think_param]
    return []


def engine_fields(req: ChatRequest, *, support: str, reads_effort: bool) -> dict[str, Any]:
    """llama.cpp's request fields for the request's thinking on a model whose template has
    ``support`` (``registry.template.Thinking``); empty when there is nothing to say."""
    if req.think is None or support == "none":
        return {}
    if not req.think:
        return {"chat_template_kwargs": {"enable_thinking": False}} if support == "switchable" else {}
    out: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if support == "switchable":
        kwargs["enable_thinking"] = True
    budget = req.think_budget
    if req.think_level is not None:
        if reads_effort:
            kwargs["reasoning_effort"] = _TEMPLATE_LEVEL[req.think_level]
        elif budget is None:
            budget = LEVEL_BUDGETS.get(req.think_level)
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    if budget is not None:
        out["reasoning_budget_tokens"] = budget
    return out


def fields_into_body(body: bytes, fields: dict[str, Any]) -> bytes:
    """A relayed OpenAI body with ``fields`` added; what the body sets itself wins (a
    client that names llama.cpp's own fields knows what it wants). The same bytes come
    back when nothing is added."""
    if not fields:
        return body
    doc = msgspec.json.decode(body)
    if not isinstance(doc, dict):
        return body
    changed = False
    for key, value in fields.items():
        if key == "chat_template_kwargs":
            own = doc.get(key)
            own = own if isinstance(own, dict) else {}
            merged = {**value, **own}
            if merged != own:
                doc[key] = merged
                changed = True
        elif key not in doc:
            doc[key] = value
            changed = True
    return msgspec.json.encode(doc) if changed else body
