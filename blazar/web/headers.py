"""The ``X-Blazar-*`` headers a client may send and those the daemon answers with: one table,
read by CORS (what a page may send and read) and by discovery (``GET /.well-known/blazar``).

A header the code reads or writes belongs here (``tests/blazar/test_discovery.py`` checks the
source for any that is missing); the daemon's own internal ones (a batch item's
``x-blazar-act-as``, a certificate run's ``x-blazar-certifying``, a peer's
``x-blazar-relayed-by``) are in ``INTERNAL``, never offered to clients.
"""

from __future__ import annotations

__all__ = ["INTERNAL", "REQUEST", "RESPONSE"]

REQUEST: dict[str, str] = {
    "x-blazar-priority": "high or low: the request's admission class (interactive or batch)",
    "x-blazar-class": "interactive, default, batch or background: the request's admission class",
    "x-blazar-deadline-ms": "a deadline in milliseconds from arrival: refused at once when it cannot be met",
    "x-blazar-keep-alive": "how long the model stays loaded after the request (seconds or a duration)",
    "x-blazar-client": "the fairness key of a request without an API key",
    "x-blazar-strict": "1: refuse a parameter the daemon cannot honour instead of naming it",
    "x-blazar-engine": "run on another lane the model allows (LANE)",
    "x-blazar-mcp": "offer these MCP servers' tools and run the tool loop (NAME,…|all|none)",
    "x-blazar-mcp-approve": "let these approval-listed MCP tools run for this request",
    "x-blazar-mcp-catalog": "compact: MCP tools as three meta-tools (find, schema, call); full: every schema",
    "x-blazar-best-of": "run N candidates and answer with the best",
    "x-blazar-cascade": "models tried cheapest first, the next when an answer fails its checks",
    "x-blazar-late-chunking": "1: embed input chunks of one text together (embeddings routes)",
    "x-blazar-resumable": "on: keep a streamed answer so it can be resumed (GET /v1/stream); off: do not",
    "x-blazar-cache": "on: answer from the semantic cache when a recent prompt meant the same; off: do not",
    "x-blazar-cache-ttl": "seconds: the oldest cached answer accepted, and how long this answer is kept",
    "x-blazar-cache-threshold": "0 to 1: the cosine similarity a cached prompt needs to count as the same",
}
"""The headers a client may send, with what each asks for."""

RESPONSE: dict[str, str] = {
    "x-blazar-trace-id": "the request's id: its card, its ledger record, `blazar why`",
    "x-blazar-ignored": "the parameters that had no effect",
    "x-blazar-changed": "the parameters that ran with another value (NAME=VALUE)",
    "x-blazar-context": "the per-slot context the request ran with",
    "x-blazar-context-asked": "the context an Ollama num_ctx asked for, when it was clamped",
    "x-blazar-output-cap": "the configured output cap, when the request named none",
    "x-blazar-status": "loading: the model's engine was started for this request",
    "x-blazar-warnings": "each way the daemon did less than asked without failing (template_no_tools, …)",
    "x-blazar-structured-output": "how structured output was enforced, and whether the answer is valid",
    "x-blazar-best-of": "how many candidates ran, which one answers and why",
    "x-blazar-cascade": "the cascade step that answered, and those that escalated",
    "x-blazar-mcp": "the MCP tool loop's rounds and calls (or the servers, on a stream)",
    "x-blazar-target": "the failover chain's target that served",
    "x-blazar-failover": "the failover targets passed over, with their codes",
    "x-blazar-peer": "the peer daemon that served a federated request",
    "x-blazar-peer-trace-id": "the request's id on that peer",
    "x-blazar-peers-passed": "the peers tried before, and passed over",
    "x-blazar-stream-id": "the id of a resumable stream (GET /v1/stream?id=…)",
    "x-blazar-worker": "the data-plane worker that relayed the answer (with workers above 1)",
    "x-blazar-cache": "hit, miss or bypass: what the semantic cache did for the request",
    "x-blazar-cache-reason": "why the semantic cache missed or was bypassed (stream, tools, sampling, …)",
    "x-blazar-cache-similarity": "the cosine similarity of the nearest cached prompt",
    "x-blazar-cache-age": "seconds since a cached answer was made",
    "x-blazar-policy": "the policy hooks that ran and what each did (NAME=allow|rewrite|redact|…)",
    "x-blazar-queue-ms": "milliseconds the inference request waited in the admission queue",
    "x-blazar-overhead-ms": "milliseconds of the gateway's own time (a stream's: until the engine had it)",
}
"""The headers the daemon answers with, with what each says."""

INTERNAL = frozenset(
    {
        "x-blazar-act-as",
        "x-blazar-certifying",
        "x-blazar-relayed-by",
        "x-blazar-handoff",
        "x-blazar-worker-token",
        "x-blazar-worker-client",
        "x-blazar-worker-scheme",
    }
)
"""Headers only the daemon sends itself (batch items, certificate runs, peers, and between
the runtime and its data-plane workers)."""
