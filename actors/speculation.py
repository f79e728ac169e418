"""Speculative decoding: which draft may pair with a model, and when to stop speculating.

Two pure parts and one small book:

- ``pair_problem`` says why a draft model cannot draft for a model (None when it can).
  The rules: never the model with itself (same name or same bytes); never across formats
  (both GGUF, both on the llama.cpp lane, which is the lane that runs drafts here); the
  same vocabulary, as llama.cpp itself requires of a draft (same tokenizer kind and
  pre-tokenizer, same BOS/EOS tokens, at most ``VOCAB_SLACK`` tokens more or fewer);
  and a draft smaller than the model it drafts for (a larger one only slows it).
- ``govern`` is the governor: fed the tokens drafted and accepted as requests end, it
  parks speculation for a model whose acceptance stays below ``PARK_BELOW`` for
  ``PARK_AFTER`` windows of ``WINDOW_S`` in a row, and lets it resume after
  ``RESUME_AFTER_S`` (the text may have changed). A window with fewer than
  ``MIN_DRAFTED`` drafted tokens says nothing and is not judged.
- ``SpeculationBook`` keeps, per model, the totals (``/metrics``) and the governor's
  state and last decision (``blazar explain``, ``blazar why``); the runtime owns it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from registry.errors import RegistryError

if TYPE_CHECKING:
    from actors.config import RuntimeConfig
    from registry.store import Store

__all__ = [
    "MIN_DRAFTED",
    "PARK_AFTER",
    "PARK_BELOW",
    "RESUME_AFTER_S",
    "VOCAB_SLACK",
    "WINDOW_S",
    "Candidate",
    "Effect",
    "GovernorState",
    "SpeculationBook",
    "SpeculationStatistics",
    "Vocabulary",
    "candidate",
    "draft_options",
    "govern",
    "pair_problem",
    "vocabulary",
]

WINDOW_S = 60.0
"""The governor judges acceptance over windows of this many seconds."""
PARK_BELOW = 0.15
"""A window whose acceptance (accepted / drafted tokens) is below this is a low one."""
PARK_AFTER = 2
"""Low windows in a row that park speculation."""
MIN_DRAFTED = 32
"""Drafted tokens a window needs to be judged at all."""
RESUME_AFTER_S = 600.0
"""How long speculation stays parked before it is tried again (ten windows)."""
VOCAB_SLACK = 128
"""The most a draft's vocabulary size may differ from the model's (llama.cpp's own limit)."""

Effect = Literal["park", "resume"]


class Vocabulary(msgspec.Struct, frozen=True, kw_only=True):
    """The tokenizer facts a GGUF header gives, as far as a draft pairing needs them."""

    model: str | None
    """``tokenizer.ggml.model``: ``gpt2`` (byte-level BPE), ``llama`` (SentencePiece)…"""
    pre: str | None
    size: int | None
    bos: int | None
    eos: int | None


def vocabulary(values: Mapping[str, Any], array_lengths: Mapping[str, int]) -> Vocabulary:
    """A header's vocabulary facts (``registry.gguf.GGUFHeader.values`` and ``.array_lengths``)."""

    def num(key: str) -> int | None:
        v = values.get(key)
        return int(v) if isinstance(v, int) else None

    return Vocabulary(
        model=values.get("tokenizer.ggml.model"),
        pre=values.get("tokenizer.ggml.pre"),
        size=array_lengths.get("tokenizer.ggml.tokens"),
        bos=num("tokenizer.ggml.bos_token_id"),
        eos=num("tokenizer.ggml.eos_token_id"),
    )


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A model as a pairing sees it: a target, or its draft."""

    name: str
    digest: str
    path: str
    format: str
    size: int
    lane: str
    vocab: Vocabulary


def candidate(config: RuntimeConfig, store: Store, name: str, lane: str | None) -> Candidate | None:
    """An installed model as a pairing sees it (its header read for the vocabulary); None when
    no model of that name is installed. ``lane``: the one it runs on; None: its pin, else the
    llama.cpp lane for GGUF."""
    from registry.gguf import read_header

    record = store.find(name)
    if record is None:
        return None
    vocab = Vocabulary(model=None, pre=None, size=None, bos=None, eos=None)
    if record.format == "gguf" and not record.files:
        try:
            header = read_header(record.path)
            vocab = vocabulary(header.values, header.array_lengths)
        except RegistryError:
            pass  # an unreadable header shares no vocabulary: the pairing is refused
    pin = config.models.get(record.name)
    own = lane or (pin.engine if pin is not None and pin.engine else None)
    return Candidate(
        name=record.name,
        digest=record.digest,
        path=record.path,
        format=record.format,
        size=record.size,
        lane=own or ("llamacpp" if record.format == "gguf" else record.format),
        vocab=vocab,
    )


def pair_problem(model: Candidate, draft: Candidate) -> str | None:
    """Why ``draft`` cannot draft for ``model``, in words for ``blazar explain``; None if it can."""
    if draft.name == model.name or draft.digest == model.digest:
        return f"'{draft.name}' is the model itself: a model never drafts for itself"
    if draft.format != model.format or model.format != "gguf":
        return (
            f"'{draft.name}' is {draft.format} and '{model.name}' is {model.format}: a draft pairs with a "
            "model of its own format, and drafts run on the llama.cpp lane (GGUF)"
        )
    if model.lane != "llamacpp" or draft.lane != "llamacpp":
        return f"'{model.name}' runs on the {model.lane} lane: draft models run on the llama.cpp lane here"
    a, b = model.vocab, draft.vocab
    if (a.model, a.pre) != (b.model, b.pre):
        return (
            f"'{draft.name}' tokenizes as {b.model}/{b.pre} and '{model.name}' as {a.model}/{a.pre}: "
            "a draft must share the model's vocabulary"
        )
    if (a.bos, a.eos) != (b.bos, b.eos):
        return f"'{draft.name}' has other BOS/EOS tokens than '{model.name}': not the same vocabulary"
    if a.size is None or b.size is None or abs(a.size - b.size) > VOCAB_SLACK:
        return (
            f"'{draft.name}' has {b.size} tokens and '{model.name}' {a.size}: more than "
            f"{VOCAB_SLACK} apart, not the same vocabulary"
        )
    if draft.size >= model.size:
        return f"'{draft.name}' is not smaller than '{model.name}': drafting with it would slow the model"
    return None


def draft_options(model: Candidate, others: Sequence[Candidate]) -> list[tuple[Candidate, str | None]]:
    """Every other model as a draft for ``model``, with why it cannot pair (None: it can):
    those that pair first, smallest first (the smaller the draft, the cheaper each guess),
    then the others."""
    rated = [(other, pair_problem(model, other)) for other in others if other.name != model.name]
    return sorted(rated, key=lambda r: (r[1] is not None, r[0].size, r[0].name))


class GovernorState(msgspec.Struct, frozen=True, kw_only=True):
    window_start_s: float | None = None
    drafted: int = 0
    """Tokens drafted in the current window."""
    accepted: int = 0
    low_windows: int = 0
    """Judged windows in a row with acceptance below ``PARK_BELOW``."""
    last_acceptance: float | None = None
    """The last judged window's acceptance."""
    parked_at_s: float | None = None
    """When speculation was parked; None while it runs."""
    reason: str | None = None
    """The last decision, in words."""


def govern(
    state: GovernorState, *, now_s: float, drafted: int = 0, accepted: int = 0
) -> tuple[GovernorState, Effect | None]:
    """One request's drafts (or just the passing of time): the new state, and whether to
    park or resume speculation. Pure."""
    if state.parked_at_s is not None:
        if now_s - state.parked_at_s >= RESUME_AFTER_S:
            why = f"resumed after {RESUME_AFTER_S:.0f} s parked"
            return GovernorState(window_start_s=now_s, reason=why), "resume"
        return state, None
    start = state.window_start_s if state.window_start_s is not None else now_s
    total, ok = state.drafted + drafted, state.accepted + accepted
    if now_s - start < WINDOW_S:
        return msgspec.structs.replace(state, window_start_s=start, drafted=total, accepted=ok), None
    # The window is over: judge it (when it drafted enough), then start the next.
    if total < MIN_DRAFTED:
        return msgspec.structs.replace(state, window_start_s=now_s, drafted=0, accepted=0), None
    rate = ok / total
    low = state.low_windows + 1 if rate < PARK_BELOW else 0
    nxt = GovernorState(window_start_s=now_s, low_windows=low, last_acceptance=rate, reason=state.reason)
    if low >= PARK_AFTER:
        why = (
            f"parked: acceptance {rate:.2f} < {PARK_BELOW} for {PARK_AFTER} windows of {WINDOW_S:.0f} s "
            f"in a row; tried again after {RESUME_AFTER_S:.0f} s"
        )
        return msgspec.structs.replace(nxt, parked_at_s=now_s, reason=why), "park"
    return nxt, None


class ModelSpeculation(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    drafted_total: int
    accepted_total: int
    acceptance: float | None
    """Accepted / drafted over the model's whole life here; None before any draft."""
    window_acceptance: float | None
    """The last judged window's (the governor's input)."""
    parked: bool
    reason: str | None


class SpeculationStatistics(msgspec.Struct, frozen=True, kw_only=True):
    governor: bool
    models: list[ModelSpeculation]


class SpeculationBook:
    """Per model: drafted and accepted token totals, and the governor's state. Owned by the
    runtime; touched only from its event loop."""

    def __init__(self, *, governor: bool = True) -> None:
        self.governor = governor
        self._totals: dict[str, tuple[int, int]] = {}
        self._states: dict[str, GovernorState] = {}

    def observe(self, model: str, drafted: int, accepted: int, *, now_s: float) -> Effect | None:
        """A request on ``model`` ended having drafted ``drafted`` tokens, ``accepted`` of them
        kept; the governor's decision, if any."""
        if not drafted and model not in self._states:
            return None  # a model that never speculated here: nothing to count or judge
        if drafted or accepted:
            d, a = self._totals.get(model, (0, 0))
            self._totals[model] = (d + drafted, a + accepted)
        if not self.governor:
            return None
        state, effect = govern(
            self._states.get(model, GovernorState()), now_s=now_s, drafted=drafted, accepted=accepted
        )
        self._states[model] = state
        return effect

    def parked(self, model: str) -> str | None:
        """Why speculation is parked for ``model``; None when it is not."""
        state = self._states.get(model)
        return state.reason if state is not None and state.parked_at_s is not None else None

    def statistics(self) -> SpeculationStatistics:
        rows = []
        for model in sorted(set(self._totals) | set(self._states)):
            d, a = self._totals.get(model, (0, 0))
            state = self._states.get(model, GovernorState())
            rows.append(
                ModelSpeculation(
                    model=model,
                    drafted_total=d,
                    accepted_total=a,
                    acceptance=a / d if d else None,
                    window_acceptance=state.last_acceptance,
                    parked=state.parked_at_s is not None,
                    reason=state.reason,
                )
            )
        return SpeculationStatistics(governor=self.governor, models=rows)
