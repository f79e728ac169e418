"""Never silently ignore: what a response says about the request's parameters, and strict mode.

The dialect tables (``blazar.dialects.params``) say which parameters a request set
without effect; the route knows what it changed (an output limit above the context,
a context clamped). Every inference response names both, in

* ``X-Blazar-Ignored: logit_bias,options.mirostat`` — accepted, no effect;
* ``X-Blazar-Changed: max_tokens=4096,options.num_ctx=8192`` — ``NAME=VALUE`` with the
  value the request ran with instead of the one it sent;
* ``X-Blazar-Context: 4096`` — the per-slot context it ran with;
* ``X-Blazar-Warnings: template_no_tools,ctx_clamped`` — each way the daemon did less than
  asked without failing, by a stable name (``WARNINGS``); with the degrades the serving
  engine itself logged at start (``mlock_failed``, ``ctx_reduced``…: ``actors.engines.degrades``),
  on every answer that engine serves.

Strict mode (``strict = true`` in config.toml, or the request header
``X-Blazar-Strict: 1``) refuses such a request with ``400`` instead, before any
engine is started: ``PARAMETER_IGNORED`` or ``PARAMETER_CHANGED`` (a context above
what the model serves stays ``CONTEXT_TOO_LARGE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from actors.engines.degrades import DEGRADES
from blazar.errors import BlazarError, Dialect

if TYPE_CHECKING:
    from actors.engine import EngineActor

__all__ = [
    "STRICT_HEADER",
    "WARNINGS",
    "degraded",
    "output_limit",
    "refuse_ignored",
    "report",
    "truthy",
    "warnings",
]

STRICT_HEADER = "x-blazar-strict"
_YES = frozenset({"1", "true", "yes", "on"})

WARNINGS = {
    "template_no_tools": "the model's chat template takes no tools: its tool calls were emulated",
    "ctx_clamped": "the context asked for was clamped to what the model serves",
    "params_ignored": "parameters the request set had no effect (X-Blazar-Ignored names them)",
    "params_changed": "parameters ran with another value than sent (X-Blazar-Changed says which)",
    "policy_post_skipped": "a post policy hook did not see this streamed answer (X-Blazar-Policy names it)",
    **{name: f"engine: {meaning}" for name, meaning in DEGRADES.items()},
}
"""The names ``X-Blazar-Warnings`` uses, and what each means: the request's own, then the
serving engine's (``actors.engines.degrades.DEGRADES``)."""


def truthy(value: str | None) -> bool:
    """A header that switches something on: ``1``, ``true``, ``yes`` or ``on``."""
    return value is not None and value.strip().lower() in _YES


def _them(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


def refuse_ignored(ignored: list[str], *, strict: bool) -> None:
    if strict and ignored:
        names = ", ".join(ignored)
        raise BlazarError(
            "PARAMETER_IGNORED",
            f"strict mode: {names} would have no effect on this daemon — leave {_them(ignored)} "
            f"out, or drop strict mode to have {_them(ignored)} ignored and named in X-Blazar-Ignored",
            param=ignored[0],
        )


def output_limit(asked: int | None, ctx: int, *, param: str, model: str, strict: bool) -> int | None:
    """The output limit a request runs with instead of ``asked`` when that exceeds the per-slot
    context ``ctx`` (None: ``asked`` stands). Strict mode refuses, in OpenAI's and Anthropic's
    own words for an output limit above the model's."""
    if asked is None or asked <= ctx:
        return None
    if strict:
        raise BlazarError(
            "PARAMETER_CHANGED",
            f"strict mode: {param} {asked} exceeds the {ctx}-token context of '{model}' and would be "
            f"capped to {ctx} — send {param} {ctx} or less",
            param=param,
            wordings={
                Dialect.OPENAI: (
                    f"{param} is too large: {asked}. This model supports at most {ctx} completion "
                    f"tokens, whereas you provided {asked}. (strict mode: Blazar would cap it)"
                ),
                Dialect.ANTHROPIC: (
                    f"{param}: {asked} > {ctx}, which is the maximum allowed number of output tokens "
                    f"for {model} (strict mode: Blazar would cap it)"
                ),
            },
        )
    return ctx


def degraded(engine: EngineActor | None) -> list[str]:
    """The names of what ``engine`` logged at start it does less than asked, for ``report``."""
    return [d.name for d in engine.degrades] if engine is not None else []


def warnings(
    *,
    ignored: list[str],
    changed: list[str],
    emulated_tools: bool,
    ctx_clamped: bool,
    degrades: Sequence[str] = (),
) -> list[str]:
    """The ``WARNINGS`` that apply to a request that ran (``degrades``: its engine's)."""
    found = []
    if emulated_tools:
        found.append("template_no_tools")
    if ctx_clamped:
        found.append("ctx_clamped")
    if ignored:
        found.append("params_ignored")
    if changed and not (ctx_clamped and all(c.startswith("options.num_ctx=") for c in changed)):
        found.append("params_changed")
    found.extend(d for d in degrades if d not in found)
    return found


def report(
    headers: dict[str, str],
    *,
    ignored: list[str],
    changed: list[str],
    context: int | None,
    emulated_tools: bool = False,
    ctx_clamped: bool = False,
    degrades: Sequence[str] = (),
) -> None:
    """Add the headers that say what became of the request's parameters to ``headers``
    (``degrades``: the serving engine's, ``degraded(engine)``)."""
    if ignored:
        headers["X-Blazar-Ignored"] = ",".join(ignored)
    if changed:
        headers["X-Blazar-Changed"] = ",".join(changed)
    if context is not None:
        headers["X-Blazar-Context"] = str(context)
    said = warnings(
        ignored=ignored,
        changed=changed,
        emulated_tools=emulated_tools,
        ctx_clamped=ctx_clamped,
        degrades=degrades,
    )
    if said:
        headers["X-Blazar-Warnings"] = ",".join(said)
