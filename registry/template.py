"""What a model's chat template can express, found by rendering it once.

llama.cpp renders the GGUF's Jinja chat template itself; the gateway only needs
to know, before it sends a conversation, whether the template keeps a system
turn that comes after the first user turn (agents such as Claude Code send
those) or refuses or drops it, and whether it can think: whether the prompt it
writes opens a reasoning section (``<think>``) and whether ``enable_thinking`` or
``reasoning_effort`` change it. Rendering a probe conversation with Jinja's
sandbox answers that without an engine, the way the template will behave.

The three answers together are ``facts_of`` a template (``TemplateFacts``), which the
store keeps on disk by the template's digest (``Store.template_facts``): Jinja is imported
and the template rendered once per template, not at every engine start, where it would
delay the engine's spawn by a tenth of a second.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any, Literal

import msgspec

__all__ = [
    "FACTS_VERSION",
    "TemplateFacts",
    "Thinking",
    "allows_system_turns",
    "facts_of",
    "import_jinja",
    "reads_effort",
    "thinking_support",
]

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


_JINJA_IMPORT = threading.Lock()


def import_jinja() -> ModuleType:
    """``jinja2.sandbox``, imported by one thread at a time. Jinja's modules import each other:
    a second thread importing them while the first is midway (the daemon loads its web
    framework, which imports Jinja, in a worker thread) can get a half-initialised module
    and an ImportError. Whoever imports Jinja, or a package that does, goes through here."""
    with _JINJA_IMPORT:
        import jinja2.sandbox

        return jinja2.sandbox


def _failures() -> tuple[type[Exception], ...]:
    """What rendering a template that cannot take the probe raises."""
    import_jinja()
    import jinja2

    return (_Refused, jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError)


def _render(template: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    env = import_jinja().ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token="", eos_token="", tools=None, **extra
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
    except _failures():
        return False


Thinking = Literal["none", "always", "switchable"]
"""What a template does about reasoning: ``none`` (the model cannot think), ``always``
(it thinks and nothing turns it off), ``switchable`` (``enable_thinking`` turns it on
and off)."""

_ASK = [{"role": "user", "content": "blazar-probe-user"}]
_MARKERS = ("<think>", "reasoning_content", "<|channel|>analysis", "[THINK]", "<seed:think>")
"""Text a thinking template writes or reads: reasoning tags, or the field of earlier
reasoning (llama.cpp hands a message's reasoning to the template under that name)."""


def _try_render(template: str, **extra: Any) -> str | None:
    try:
        return _render(template, _ASK, **extra)
    except _failures():
        return None


def thinking_support(template: str | None) -> Thinking:
    """Whether a model with this chat template can think, and whether that can be switched.

    Switchable: the prompt differs with ``enable_thinking`` true and false (Qwen3 and its
    kin open or close the reasoning section in the generation prompt). Always: the
    template names a reasoning marker but has no such switch (DeepSeek-R1's opens
    ``<think>`` every time). No template (llama.cpp's ChatML) cannot think."""
    if template is None:
        return "none"
    on = _try_render(template, enable_thinking=True)
    off = _try_render(template, enable_thinking=False)
    if on is not None and off is not None and on != off:
        return "switchable"
    return "always" if any(m in template for m in _MARKERS) else "none"


def reads_effort(template: str | None) -> bool:
    """Whether the template writes ``reasoning_effort`` into the prompt (gpt-oss's does):
    then a level goes to the template instead of becoming a token budget."""
    if template is None or "reasoning_effort" not in template:
        return False
    low = _try_render(template, reasoning_effort="low")
    high = _try_render(template, reasoning_effort="high")
    return low is not None and high is not None and low != high


FACTS_VERSION = 1
"""Part of the key of the facts kept on disk: raise it when what the probes find changes."""


class TemplateFacts(msgspec.Struct, frozen=True):
    """What a chat template can express (see the functions above)."""

    system_turns: bool = True
    thinking: Thinking = "none"
    reads_effort: bool = False


def facts_of(template: str | None) -> TemplateFacts:
    """The three answers for ``template`` (None: llama.cpp's default), rendering it."""
    if template is None:
        return TemplateFacts()
    thinking = thinking_support(template)
    return TemplateFacts(
        system_turns=allows_system_turns(template),
        thinking=thinking,
        reads_effort=thinking != "none" and reads_effort(template),
    )
