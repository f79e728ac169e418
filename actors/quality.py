"""How much worse is a quantized model? Its perplexity over a fixed text, measured by a real
engine, beside the original's (``blazar quantize --verify``).

``perplexity`` starts the model's engine (the lane the daemon would use, one slot, its own
child and run dir, stopped after) and reads the text token by token: at each position it
asks the engine's ``/completion`` for one token after the text so far, pushed to the text's
next token by a logit bias, and takes that token's probability as the engine reports it
(llama.cpp reports the probabilities of its raw logits, before any sampler, the bias
included). Perplexity is ``exp`` of the mean negative log-probability. The prompt cache
keeps each step to one new token. ``judge`` is the pure decision on two measurements.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import httpx
import msgspec
import trio

from actors.config import RuntimeConfig
from actors.engine import EngineActor, EnsureReady
from actors.engines.routing import lane_for
from actors.errors import BlazarRuntimeError
from actors.planning import launch_spec_for
from registry.store import Store

__all__ = ["MAX_TOKENS", "PASSAGE", "Quality", "Verdict", "judge", "perplexity", "perplexity_of", "verify"]

PASSAGE = (
    "The river starts high in the mountains, where snow melts in the spring sun and runs down "
    "the rocks in small streams. The streams meet in the valley and become a river that turns "
    "the wheels of an old mill. Farmers along its banks grow wheat, apples and grapes, and in "
    "the autumn they carry the harvest to the market in the town. The town has a stone bridge, "
    "a church with a tall tower, and a school where children learn to read, write and count. "
    "In the evening, families sit together at the table, eat bread and soup, and talk about the "
    "day."
)
"""The built-in text: plain English any chat model has seen much of, about 120 tokens."""

MAX_TOKENS = 1024
"""The most predictions one measurement makes: a longer text is cut there."""
_BIAS = 100.0
"""Added to the next token's logit so that the engine takes it; the probability reported is
the raw logits' (llama.cpp reports before its samplers)."""


class Quality(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    perplexity: float
    tokens: int
    """How many predictions the perplexity averages."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    before: Quality
    after: Quality
    degradation_pct: float
    """How much higher the perplexity after is than before, in percent (negative: lower)."""
    max_degradation_pct: float
    kept: bool


def perplexity_of(logprobs: list[float]) -> float:
    """``exp`` of the mean negative natural log-probability."""
    if not logprobs:
        raise ValueError("no log-probabilities to average")
    return math.exp(-sum(logprobs) / len(logprobs))


def judge(before: Quality, after: Quality, max_degradation_pct: float) -> Verdict:
    """Is ``after`` (the quantized model) within ``max_degradation_pct`` of ``before``?"""
    change = (after.perplexity - before.perplexity) / before.perplexity * 100.0
    return Verdict(
        before=before,
        after=after,
        degradation_pct=change,
        max_degradation_pct=max_degradation_pct,
        kept=change <= max_degradation_pct,
    )


class MeasureFailed(BlazarRuntimeError):
    code = "ENGINE_CRASHED"


async def _post(client: httpx.AsyncClient, route: str, body: dict[str, object]) -> dict[str, object]:
    try:
        resp = await client.post(route, json=body, timeout=120)
    except httpx.RemoteProtocolError:  # a kept-alive connection the engine closed: once more
        resp = await client.post(route, json=body, timeout=120)
    if resp.status_code != 200:
        raise MeasureFailed(f"the engine answered {route} with HTTP {resp.status_code}: {resp.text[:200]}")
    return dict(resp.json())


async def _logprob(client: httpx.AsyncClient, context: list[int], token: int) -> float:
    body = {
        "prompt": context,
        "n_predict": 1,
        "n_probs": 1,
        "temperature": 0,
        "logit_bias": [[token, _BIAS]],
        "cache_prompt": True,
    }
    doc = await _post(client, "/completion", body)
    probs = doc.get("completion_probabilities")
    if not isinstance(probs, list) or not probs:
        raise MeasureFailed("the engine gave no token probabilities (n_probs)")
    first = probs[0]
    if first.get("id") != token:
        raise MeasureFailed(f"the engine took token {first.get('id')} where the text has {token}")
    if "logprob" in first:
        return float(first["logprob"])
    return math.log(max(float(first["prob"]), 1e-30))


async def perplexity(config: RuntimeConfig, model: str, *, text: str = PASSAGE) -> Quality:
    """``model``'s perplexity over ``text`` (its first ``MAX_TOKENS`` tokens), measured by its
    engine started for it alone."""
    store = Store(Path(config.models_dir))
    record = await trio.to_thread.run_sync(store.get, model)
    spec = await trio.to_thread.run_sync(launch_spec_for, config, store, record)
    spec = msgspec.structs.replace(spec, slots=1, ctx_per_slot=MAX_TOKENS + 16)
    lane = lane_for(spec, config.engine, config.home)
    with tempfile.TemporaryDirectory(prefix="blazar-quality-") as run_dir:
        engine = EngineActor(spec, config.engine, run_dir=Path(run_dir), lane=lane)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            try:
                with trio.fail_after(config.engine.start_timeout_s + 10):
                    handle = await engine.ask(EnsureReady())
                doc = await _post(handle.client, "/tokenize", {"content": text, "add_special": True})
                tokens = [int(t) for t in doc.get("tokens") or []][: MAX_TOKENS + 1]  # type: ignore[attr-defined]
                if len(tokens) < 2:
                    raise MeasureFailed("the text made fewer than two tokens")
                logprobs = [
                    await _logprob(handle.client, tokens[:i], tokens[i]) for i in range(1, len(tokens))
                ]
            finally:
                nursery.cancel_scope.cancel()
    return Quality(model=record.name, perplexity=perplexity_of(logprobs), tokens=len(logprobs))


async def verify(
    config: RuntimeConfig, source: str, result: str, max_degradation_pct: float, *, text: str = PASSAGE
) -> Verdict:
    """Measure ``source`` and ``result`` (its quantized copy) one after the other and judge
    them; a ``result`` that degrades more than allowed, or that could not be measured, is
    removed from the store (its blob goes with it when no other name uses it)."""
    store = Store(Path(config.models_dir))
    before = await perplexity(config, source, text=text)
    try:
        after = await perplexity(config, result, text=text)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.remove, result)
        raise
    verdict = judge(before, after, max_degradation_pct)
    if not verdict.kept:
        await trio.to_thread.run_sync(store.remove, result)
    return verdict
