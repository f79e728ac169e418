"""The test requests, shaped as each family of tools sends them (answers capped to stay cheap)."""

from __future__ import annotations

from blazar.connect._plan import Context, Probe

__all__ = [
    "anthropic_messages",
    "chat_completions",
    "list_models",
    "ollama_chat",
    "ollama_show",
    "ollama_tags",
    "responses",
]

PROMPT = "Say hello."
MAX_TOKENS = 16
"""Every probe caps its answer: it proves the route, the key and the model, not the model's prose."""


def _bearer(ctx: Context) -> dict[str, str]:
    return {"authorization": f"Bearer {ctx.key}", "content-type": "application/json"}


def chat_completions(ctx: Context, *, user_agent: str, include_usage: bool = True) -> Probe:
    """``POST /v1/chat/completions`` streamed, as OpenAI-compatible clients send it."""
    body = {
        "model": ctx.model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": PROMPT},
        ],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    headers = _bearer(ctx) | {"accept": "text/event-stream", "user-agent": user_agent}
    return Probe(method="POST", path="/v1/chat/completions", headers=headers, body=body, answer="sse-chat")


def responses(ctx: Context) -> Probe:
    """``POST /v1/responses`` as Codex CLI sends a turn: streamed, not stored, no tools here."""
    body = {
        "model": ctx.model,
        "instructions": "You are a helpful assistant. Answer briefly.",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "include": [],
        "max_output_tokens": MAX_TOKENS,
    }
    headers = _bearer(ctx) | {"accept": "text/event-stream", "originator": "codex_exec"}
    return Probe(method="POST", path="/v1/responses", headers=headers, body=body, answer="sse-responses")


def anthropic_messages(ctx: Context) -> Probe:
    """``POST /v1/messages?beta=true`` as Claude Code sends it (bearer token, its beta header)."""
    body = {
        "model": ctx.model,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "system": [{"type": "text", "text": "You are a helpful assistant."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
        "metadata": {"user_id": "blazar-connect"},
    }
    headers = _bearer(ctx) | {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219",
        "x-app": "cli",
        "accept": "application/json",
    }
    return Probe(
        method="POST", path="/v1/messages?beta=true", headers=headers, body=body, answer="sse-anthropic"
    )


def ollama_show(ctx: Context) -> Probe:
    return Probe(method="POST", path="/api/show", body={"name": ctx.model}, answer="json")


def ollama_chat(ctx: Context) -> Probe:
    """``POST /api/chat`` streamed, as litellm's ``ollama_chat/`` sends it for aider."""
    body = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "options": {"temperature": 0, "num_predict": MAX_TOKENS},
    }
    return Probe(method="POST", path="/api/chat", body=body, answer="ndjson")


def list_models(ctx: Context) -> Probe:
    return Probe(method="GET", path="/v1/models", headers={"authorization": f"Bearer {ctx.key}"})


def ollama_tags(ctx: Context) -> Probe:
    return Probe(method="GET", path="/api/tags")
