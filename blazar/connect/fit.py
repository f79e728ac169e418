"""Whether a tool's first real turn fits the context the daemon gives a model, and what to set
when it does not. Pure: the caller reads config.toml, the store and the catalog.

The connect test request is 16 tokens, so it passes on any context; the tool's first real turn
(its system prompt and tool schemas) is far larger for the coding agents. A slot must hold
that turn and room for an answer."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from actors.context import context_limit, rope_factor

__all__ = [
    "ANSWER_ROOM",
    "Candidate",
    "Fit",
    "ModelContext",
    "check_fit",
    "ctx_refusal",
    "model_context",
    "output_cap_edit",
    "suggested_ctx",
]

ANSWER_ROOM = 1024
"""Tokens left for an answer beside the first turn: a few paragraphs or one tool call with its
arguments. Later turns grow (tool results, the conversation), so this is the least that works."""

FALLBACK_CTX = 4096
"""The training context the daemon assumes for a model whose header does not say
(``actors.settings.FALLBACK_CTX``)."""


class ModelContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon will give one model, from config.toml and the model's header."""

    name: str
    ctx: int
    """The context per slot its engine gets."""
    configured: bool
    """``ctx`` is set in the model's own table, ``[models."NAME"]``."""
    trained: int | None
    """The training context (GGUF ``context_length``); None: the header does not say."""
    extended: bool
    """``rope_scaling`` is set for it: a slot may hold more than the training context."""
    rope_scale: float | None = None
    """Its configured extension factor: a slot holds at most training context x this. None
    with ``extended``: just enough for any ``ctx``."""

    def can_hold(self, ctx: int) -> bool | None:
        """A slot of ``ctx`` tokens is within what the model can serve; None: unknown."""
        if self.trained is None:
            return None
        if self.extended:
            return self.rope_scale is None or self.trained * self.rope_scale >= ctx
        return self.trained >= ctx


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A model that could run the tool instead: installed, or in the catalog."""

    name: str
    trained: int
    installed: bool
    tools: bool = False
    """Its chat template takes tools natively (the catalog's ``tools`` capability)."""
    size: int = 0


class Fit(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    model: str
    first_turn: int
    """The tool's typical first turn, in tokens."""
    need: int
    """That turn and room for an answer."""
    ctx: int
    fits: bool
    suggest_ctx: int | None = None
    """The ``ctx`` to set (None: it fits)."""
    trained: int | None = None
    training_allows: bool | None = None
    """The training context (or its configured extension) holds ``suggest_ctx``'s need; None:
    unknown, or it fits."""
    alternatives: list[str] = []
    """Models trained for the need, ``name (context)``, installed ones first."""
    lines: list[str] = []
    """The warning in words (empty when it fits)."""


def model_context(
    name: str,
    *,
    trained: int | None,
    default_ctx: int,
    ctx: int | None = None,
    rope_scaling: str | None = None,
    rope_scale: float | None = None,
) -> ModelContext:
    """The per-slot context the daemon gives ``name``: its ``ctx`` when set, else the smaller of
    its training context and ``default_ctx``; never above what it can serve (the daemon
    clamps), which rope scaling raises. The same rule as ``actors.settings.resolve_launch``."""
    asked = ctx or min(trained or FALLBACK_CTX, default_ctx)
    limit = context_limit(trained, rope_factor(trained, rope_scaling, rope_scale, asked))
    served = min(asked, limit) if limit is not None else asked
    return ModelContext(
        name=name,
        ctx=served,
        configured=bool(ctx),
        trained=trained,
        extended=rope_scaling is not None,
        rope_scale=rope_scale if rope_scaling is not None else None,
    )


def suggested_ctx(need: int) -> int:
    """The ``ctx`` to set for ``need`` tokens: the next power of two, as models are trained."""
    ctx = 4096
    while ctx < need:
        ctx *= 2
    return ctx


def _tokens(n: int) -> str:
    return f"{n:,}"


def check_fit(
    tool: str,
    first_turn: int | None,
    model: ModelContext,
    candidates: Iterable[Candidate] = (),
    *,
    answer_room: int = ANSWER_ROOM,
    ctx_given: bool = False,
    command: str = "blazar connect",
) -> Fit | None:
    """Whether ``tool``'s first turn and an answer fit ``model``'s slot, and what to set when not;
    None when the tool's first turn was never measured. ``ctx_given``: the ctx was just set
    with ``--ctx`` (the advice then does not offer it again); ``command``: the connect command
    that would set it (``blazar connect claude``)."""
    if first_turn is None:
        return None
    need = first_turn + answer_room
    fit = Fit(tool=tool, model=model.name, first_turn=first_turn, need=need, ctx=model.ctx, fits=True)
    if model.ctx >= need:
        return fit
    suggest = suggested_ctx(need)
    trained = model.trained
    if trained is not None and not model.extended and trained >= need:
        suggest = min(suggest, trained)  # as much as it was trained for, when that is enough
    allows = model.can_hold(suggest)
    where = "its" if model.configured else "the daemon's default"
    lines = [
        f"{tool}'s first turn is about {_tokens(first_turn)} tokens: with room for an answer it "
        f"needs {_tokens(need)}, and {model.name} gets {_tokens(model.ctx)} per slot ({where} ctx) — "
        "the test request passes, the first real turn is refused as too long",
    ]
    flag = f"`{command} --ctx {suggest} --write`"
    setting = f'ctx = {suggest} under [models."{model.name}"] in config.toml'
    if ctx_given:
        lines.append(f"set a larger ctx: {setting}")
    else:
        lines.append(f"set {setting} ({flag} does it)")
    alternatives: list[str] = []
    if allows is None:
        lines.append(f"{model.name}'s header does not say its training context: check it can hold that")
    elif model.extended:
        held = "holds" if allows else "does not hold: raise its rope_scale"
        base = _tokens(trained or 0)
        lines.append(
            f"{model.name} is extended with rope_scaling beyond its {base}-token training: {held} that ctx"
        )
    elif allows:
        lines.append(f"{model.name} was trained for {_tokens(trained or 0)} tokens: that ctx is within it")
    else:
        ranked = sorted(
            (c for c in candidates if c.trained >= need and c.name != model.name),
            key=lambda c: (not c.installed, not c.tools, c.size, c.name),
        )
        alternatives = [f"{c.name} ({_tokens(c.trained)})" for c in ranked[:4]]
        lines.append(
            f"{model.name} was trained for {_tokens(trained or 0)} tokens only: above that it needs "
            'rope_scaling = "yarn" beside the ctx (quality degrades on a model not trained for it)'
        )
        if alternatives:
            installed = [c for c in ranked[:4] if c.installed]
            kind = "installed" if len(installed) == len(alternatives) else "installed or in the catalog"
            lines.append(f"models trained for it ({kind}): " + ", ".join(alternatives))
    return msgspec.structs.replace(
        fit,
        fits=False,
        suggest_ctx=suggest,
        trained=trained,
        training_allows=allows,
        alternatives=alternatives,
        lines=lines,
    )


def ctx_refusal(model: ModelContext, ctx: int) -> str | None:
    """Why ``--ctx`` must not set ``ctx`` for ``model`` (above its training context with no
    rope scaling: the daemon would clamp it back); None: it may."""
    if model.can_hold(ctx) is not False:
        return None
    if model.extended:
        return (
            f"--ctx {ctx} is above what {model.name}'s rope_scale {model.rope_scale} extends it to "
            f"({int((model.trained or 0) * (model.rope_scale or 1))} tokens): raise rope_scale, or unset "
            "it (then the extension is just enough for the ctx)"
        )
    return (
        f"--ctx {ctx} is above the {model.trained}-token context {model.name} was trained for: the daemon "
        f'would clamp it to {model.trained}. Extend the model first (rope_scaling = "yarn" under '
        f'[models."{model.name}"], `blazar config set models.{model.name}.rope_scaling yarn`; quality '
        "degrades on a model not trained for it), or choose a model trained for more"
    )


def output_cap_edit(
    tool: str, cap: int | None, model: str, *, model_cap: int | None, top_cap_set: bool
) -> tuple[int | None, str | None]:
    """The ``max_output_tokens`` to write for ``model`` (None: nothing) and what to say, for a
    tool whose requests carry no output cap (``cap``: the one to set; None: it sends its own).
    A cap the user set, for the model or for all, is kept."""
    if cap is None:
        return None, None
    if model_cap is not None:
        kept = f"{model_cap}" if model_cap else "0 (no cap)"
        return None, f'{tool} sends no output cap: [models."{model}"] max_output_tokens = {kept} is kept'
    if top_cap_set:
        return None, f"{tool} sends no output cap: config.toml's top-level max_output_tokens applies"
    return cap, (
        f'{tool} sends no output cap: max_output_tokens = {cap} under [models."{model}"], so a small '
        "model cannot generate until its context is full"
    )
