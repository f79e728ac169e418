"""Request templates in each dialect, and the token metrics of a load-generator answer."""

from __future__ import annotations

import itertools
from typing import Any

from bench._rigs import MODEL
from bench._stats import percentile

__all__ = ["DIALECTS", "PROMPT", "chat_request", "job", "token_metrics"]

PROMPT = "Write a long story about a dragon who learns to fly over the mountains."
DIALECTS = ("openai", "ollama", "anthropic")


def chat_request(
    dialect: str,
    *,
    max_tokens: int,
    stream: bool = True,
    ignore_eos: bool = False,
    headers: dict[str, str] | None = None,
    prompt: str = PROMPT,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A load-generator request: temperature 0, fixed seed, fixed output cap."""
    messages = [{"role": "user", "content": prompt}]
    hdrs = dict(headers or {})
    if dialect == "openai":
        path = "/v1/chat/completions"
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": 1,
            "stream": stream,
        }
        if ignore_eos:
            body["ignore_eos"] = True  # llama.cpp's own field: the output always runs to max_tokens
    elif dialect == "ollama":
        path = "/api/chat"
        body = {
            "model": MODEL,
            "messages": messages,
            "stream": stream,
            "options": {"temperature": 0, "seed": 1, "num_predict": max_tokens},
        }
    elif dialect == "anthropic":
        path = "/v1/messages"
        body = {
            "model": MODEL,
            "max_tokens": max_tokens,
            "messages": messages,
            "temperature": 0,
            "stream": stream,
        }
        hdrs.setdefault("anthropic-version", "2023-06-01")
    else:
        raise ValueError(f"unknown dialect {dialect!r}")
    body |= extra or {}
    return {"method": "POST", "path": path, "body": body, "headers": hdrs, "ndjson": dialect == "ollama"}


def job(
    url: str,
    requests: list[dict[str, Any]],
    *,
    concurrency: int,
    count: int | None = None,
    duration_s: float | None = None,
    warmup: int = 0,
    events: bool = False,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """A load-generator job: ``count`` requests, or as many as fit in ``duration_s``."""
    return {
        "url": url,
        "requests": requests,
        "concurrency": concurrency,
        "count": count if count is not None else (10**9 if duration_s else 100),
        "duration_s": duration_s,
        "warmup": warmup,
        "events": events,
        "timeout_s": timeout_s,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def token_metrics(res: dict[str, Any]) -> dict[str, Any]:
    """TTFT, inter-token gaps and decode speed from the token times of each request."""
    per_request: list[list[float]] = res.get("tokens") or []
    ttft = [t[0] for t in per_request if t]
    gaps = [b - a for t in per_request for a, b in itertools.pairwise(t)]
    decode = [(len(t) - 1) / (t[-1] - t[0]) for t in per_request if len(t) > 1 and t[-1] > t[0]]
    tokens = sum(len(t) for t in per_request)
    return {
        "requests": len(per_request),
        "errors": res.get("errors", 0),
        "tokens_per_request": tokens / len(per_request) if per_request else 0.0,
        "decode_tps": percentile(decode, 50),
        "aggregate_tps": tokens / res["wall_s"] if res.get("wall_s") else None,
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "itl_p50_ms": _ms(percentile(gaps, 50)),
        "itl_p99_ms": _ms(percentile(gaps, 99)),
    }
