"""What a model's chat template can express, found by rendering it once.

llama.cpp renders the GGUF's Jinja chat template itself; the gateway only needs
to know, before it sends a conversation, whether the template keeps a system
turn that comes after the first user turn (agents such as Claude Code send
those) or refuses or drops it. Rendering a probe conversation with Jinja's
sandbox answers that without an engine, the way the template will behave.
"""

from __future__ import annotations

import time
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["allows_system_turns"]

_MARK = "blazar-probe-system-turn"
_PROBE = [
    {"role": "user", "content": "blazar-probe-user"},
    {"role": "assistant", "content": "blazar-probe-assistant"},
    {"role": "system", "content": _MARK},
    {"role": "user", "content": "blazar-probe-user-again"},
]


class _Refused(Exception):
    pass


def _raise(message: str) -> None:
    raise _Refused(message)


def _render(template: str, messages: list[dict[str, Any]]) -> str:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token="", eos_token="", tools=None
    )


def allows_system_turns(template: str | None) -> bool:
    """Whether a system message after the first user turn reaches the prompt.

    No template means llama.cpp's default (ChatML), which renders every role. A
    template that raises, drops the turn, or cannot be rendered here says no: the
    gateway then writes such turns into the user's text, which every template takes.
    """
    if template is None:
        return True
    try:
        return _MARK in _render(template, _PROBE)
    except (_Refused, jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError):
        return False
