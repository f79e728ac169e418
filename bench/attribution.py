"""Claude Code's attribution block and the prompt cache: the second prompt of a session.

Claude Code's first system block (``x-anthropic-billing-header: cc_version=…; cch=…;``)
is attribution for Anthropic's servers and changes with every prompt, while the rest of
its system prompt stays the same. At the head of the prompt it would leave the engine's
prompt cache nothing to reuse: every prompt would be read again in full. The daemon
leaves that block out of the prompt the engine sees.

One daemon (one slot, the test model). Each run sends, for each of two variants in turn,
two streamed ``POST /v1/messages`` of a session: the same long system prompt after a
first block that changes between the two (a new version and hash), then a new question.
The time measured is the second prompt's, from the send to the first text delta, with
the ``cache_read_input_tokens`` its usage reports.

- **dropped**: the first block is Claude Code's, as it sends it: the daemon drops it.
- **kept**: the same bytes under another header name, which the daemon does not know
  and keeps at the head of the prompt: what every prompt cost before the daemon dropped
  the block (the same text, the same length).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import httpx

from bench._harness import Context
from bench._rigs import MODEL, log, running_daemon
from bench._stats import ratio, summarize
from bench.sessions import _prefix

__all__ = ["TITLE", "run"]

TITLE = "Prompt cache across Claude Code's prompts (attribution block)"
CONFIG = "slots = 1\ndefault_ctx = 4096\nkeep_alive_s = -1\nmax_queue = 64\n"
MAX_TOKENS = 4
HEADERS = {"dropped": "x-anthropic-billing-header", "kept": "x-other-billing-header"}


def _system(variant: str, prefix: str) -> list[dict[str, str]]:
    nonce = secrets.token_hex(3)
    block = (
        f"{HEADERS[variant]}: cc_version=2.1.{int(nonce, 16) % 1000}.{nonce}; cc_entrypoint=cli; cch={nonce};"
    )
    return [{"type": "text", "text": block}, {"type": "text", "text": prefix}]


def _turn(url: str, variant: str, prefix: str, question: str) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "system": _system(variant, prefix),
        "messages": [{"role": "user", "content": question}],
    }
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=900.0) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("type") == "content_block_delta" and first is None:
                first = time.perf_counter() - t0
            usage.update((event.get("message") or {}).get("usage") or {})
            usage.update(event.get("usage") or {})
    return {
        "ttft_s": first if first is not None else time.perf_counter() - t0,
        "input_tokens": usage.get("input_tokens"),
        "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
    }


def run(ctx: Context) -> dict[str, Any]:
    prefix = _prefix(ctx.pick(120, 20))
    runs: list[dict[str, Any]] = []
    with running_daemon(CONFIG, tag="attribution") as daemon:
        _turn(daemon.url, "dropped", "Hello.", "Hi.")  # the engine is up
        for r in range(ctx.runs):
            log(f"attribution: run {r + 1}/{ctx.runs}")
            one: dict[str, Any] = {}
            order = ("dropped", "kept") if r % 2 == 0 else ("kept", "dropped")
            for variant in order:
                _turn(daemon.url, variant, prefix, "What colour is house 3?")
                one[variant] = _turn(daemon.url, variant, prefix, "How many windows has house 5?")
            runs.append(one)

    def get(variant: str, key: str) -> dict[str, Any]:
        return summarize(r[variant][key] for r in runs)

    speedup = summarize(ratio(r["kept"]["ttft_s"], r["dropped"]["ttft_s"]) for r in runs)
    tokens = runs[0]["dropped"]["input_tokens"] if runs else None
    return {
        "title": TITLE,
        "method": __doc__ or "",
        "params": {"max_tokens": MAX_TOKENS, "slots": 1, "default_ctx": 4096, "system_blocks": 2},
        "values": {
            "dropped_second_ttft_s": get("dropped", "ttft_s"),
            "kept_second_ttft_s": get("kept", "ttft_s"),
            "second_prompt_speedup": speedup,
        },
        "tables": [
            {
                "title": f"Second prompt of a session, first token; median [min, max] over {len(runs)} runs",
                "columns": ["attribution block", "seconds", "cache_read_input_tokens", "input_tokens"],
                "rows": [
                    [
                        f"{variant} ({HEADERS[variant]})",
                        get(variant, "ttft_s"),
                        get(variant, "cache_read_input_tokens"),
                        get(variant, "input_tokens"),
                    ]
                    for variant in ("dropped", "kept")
                ],
            },
            {
                "title": "Second prompt: kept ÷ dropped (first token)",
                "columns": ["ratio"],
                "rows": [[speedup]],
            },
        ],
        "plots": [],
        "commands": {
            "config": CONFIG.strip().replace("\n", "; "),
            "turn": "POST /v1/messages (stream) twice per variant; the second one timed",
            "prompt_tokens": str(tokens),
        },
        "raw_runs": runs,
    }
