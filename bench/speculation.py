"""Speculative decoding by n-gram lookup on the test model: decode speed with and without.

Only one GGUF model exists here (SmolLM2-135M), and a model never drafts for itself, so
the draft-model pairing cannot be measured; llama.cpp's draftless n-gram lookup can. The
daemon's own engine argv (read from /proc) is started three times by hand on other
ports: as it is (speculation off), and with the flags ``spec = {ngram = KIND, max = 16}``
gives it (``actors.engines.llamacpp.speculation_flags``) for ``ngram-simple`` and
``ngram-mod``. Each run sends two prompts to each engine in turn, greedy (temperature 0)
with a fixed ``max_tokens``: one that makes the model copy a paragraph (text that repeats
its prompt: what n-gram lookup is for) and one open question (text that does not). The
prompts change from run to run (the paragraph's sentences rotate, the story's hero is
renamed): ngram-mod's hash pool is shared by all requests of an engine, and the same
prompt again would be answered from what it learnt the run before. Figures are the
engine's own ``timings``: decode tokens per second, and drafted / accepted tokens.
"""

from __future__ import annotations

from typing import Any

import httpx

from actors.engines.llamacpp import speculation_flags
from actors.engines.spec import LaunchSpec, SpecLoad
from bench._harness import Context
from bench._rigs import (
    DirectEngine,
    daemon_commands,
    engine_config,
    engine_of,
    load_model,
    log,
    redact,
    running_daemon,
)
from bench._stats import ratio, summarize
from tests.support import MODEL

__all__ = ["TITLE", "run"]

TITLE = "Speculative decoding: n-gram lookup"
KINDS = ("ngram-simple", "ngram-mod")
_SENTENCES = (
    "The river bends past seven quiet mills where grey herons wait for the evening tide.",
    "Each mill keeps a wheel of oak, a stone of granite and a miller who counts the sacks twice.",
    "When the tide turns, the herons lift together and the wheels slow down one after another.",
)
_NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas")


def _prompts(run: int) -> dict[str, str]:
    """The run's two prompts, new in each run: ngram-mod's pool outlives a request, and a
    prompt asked again would be answered from what it learnt the run before."""
    k = run % len(_SENTENCES)
    paragraph = " ".join(_SENTENCES[k:] + _SENTENCES[:k])
    name = _NAMES[run % len(_NAMES)]
    return {
        "copy": f"Copy this text exactly, word for word, twice:\n\n{paragraph}",
        "open": f"Write a short story about a lighthouse keeper called {name} who finds a map.",
    }


PROMPTS = ("copy", "open")


def _flags(kind: str) -> list[str]:
    spec = LaunchSpec(model=MODEL, path="", ctx_per_slot=1, slots=1, speculation=SpecLoad(ngram=kind, max=16))
    return speculation_flags(spec)


def _ask(engine: DirectEngine, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    headers = {"Authorization": f"Bearer {engine.api_key}"}
    resp = httpx.post(f"{engine.url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    resp.raise_for_status()
    t = resp.json()["timings"]
    drafted = t.get("draft_n") or 0
    return {
        "decode_tps": t.get("predicted_per_second"),
        "drafted": drafted,
        "accepted": t.get("draft_n_accepted") or 0,
        "acceptance": (t.get("draft_n_accepted") or 0) / drafted if drafted else None,
    }


def run(ctx: Context) -> dict[str, Any]:
    max_tokens = ctx.pick(128, 24)
    config = engine_config(1)
    runs: list[dict[str, Any]] = []
    with running_daemon(config, tag="speculation") as daemon:
        load_model(daemon.url)
        info = engine_of(daemon.url)
        variants = {"off": DirectEngine(info.argv, log_dir=ctx.work_dir)}
        for kind in KINDS:
            variants[kind] = DirectEngine([*info.argv, *_flags(kind)], log_dir=ctx.work_dir)
        try:
            for engine in variants.values():
                engine.start()
                _ask(engine, "Hi", 4)  # warm
            for r in range(ctx.runs):
                log(f"speculation: run {r + 1}/{ctx.runs}")
                one: dict[str, Any] = {}
                for workload, prompt in _prompts(r).items():
                    for name, engine in variants.items():
                        one[f"{workload}/{name}"] = _ask(engine, prompt, max_tokens)
                runs.append(one)
            commands = daemon_commands(config) | {
                f"engine ({name})": " ".join(redact(e.argv)) for name, e in variants.items()
            }
        finally:
            for engine in variants.values():
                engine.stop()

    def get(key: str, figure: str) -> dict[str, Any]:
        return summarize(r[key][figure] for r in runs)

    rows = []
    for workload in PROMPTS:
        for name in variants:
            key = f"{workload}/{name}"
            speedup = summarize(ratio(r[key]["decode_tps"], r[f"{workload}/off"]["decode_tps"]) for r in runs)
            rows.append(
                [workload, name, get(key, "decode_tps"), speedup, get(key, "drafted"), get(key, "acceptance")]
            )
    values = {
        f"spec_{kind.replace('-', '_')}_{w}_speedup": summarize(
            ratio(r[f"{w}/{kind}"]["decode_tps"], r[f"{w}/off"]["decode_tps"]) for r in runs
        )
        for kind in KINDS
        for w in PROMPTS
    }
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"model": MODEL, "max_tokens": max_tokens, "draft max": 16, "kinds": list(KINDS)},
        "values": values,
        "tables": [
            {
                "title": f"Greedy decoding, one stream (median [min, max] over {len(runs)} runs)",
                "columns": [
                    "prompt",
                    "speculation",
                    "decode tok/s",
                    "speed-up vs off",
                    "drafted",
                    "acceptance",
                ],
                "rows": rows,
            }
        ],
        "plots": [],
        "notes": [
            "no second GGUF model exists here, and a model never drafts for itself: "
            "draft-model speculation is not measured"
        ],
        "commands": commands,
        "raw_runs": runs,
    }
