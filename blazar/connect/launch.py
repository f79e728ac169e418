"""The environment ``blazar launch`` runs a tool in: every variable the known tools read to find
an OpenAI, Anthropic or Ollama server, pointed at the daemon."""

from __future__ import annotations

__all__ = ["launch_env"]


def launch_env(base_url: str, key: str, model: str | None) -> dict[str, str]:
    base = base_url.rstrip("/")
    env = {
        # OpenAI SDKs (and the tools built on them), litellm (aider) and Codex's --oss.
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_BASE": f"{base}/v1",
        "OPENAI_API_KEY": key,
        "CODEX_OSS_BASE_URL": f"{base}/v1",
        # Anthropic SDKs and Claude Code (a token, not a key: no login, no conflict warning).
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_AUTH_TOKEN": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Claude Code's per-prompt attribution block would defeat the engine's prompt cache.
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        # Ollama clients; litellm's ollama_chat/ route.
        "OLLAMA_HOST": base,
        "OLLAMA_API_BASE": base,
        # The key Codex's blazar provider names (`blazar connect codex --key`), and Blazar's SDK.
        "BLAZAR_API_KEY": key,
        "BLAZAR_URL": base,
    }
    if model is not None:
        env |= {
            "OPENAI_MODEL": model,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "AIDER_MODEL": f"ollama_chat/{model}",
        }
    return env
