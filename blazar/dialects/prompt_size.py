"""How big a prompt is, cheaply: enough to refuse one that cannot fit before an engine sees it.

One token stands for at most ``token_bytes_max`` bytes of text (the longest
entry of the model's vocabulary), and a chat template copies every message's
text into the prompt, so a conversation with B bytes of message text takes at
least B / ``token_bytes_max`` tokens, whatever the template adds around it.
Every turn also costs the template's own markers; how many tokens that is
depends on the template, so it is measured per model (``message_tokens``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from blazar.dialects.neutral import ChatRequest

__all__ = ["PromptSize", "chat_size", "completion_size"]


class PromptSize(msgspec.Struct, frozen=True, kw_only=True):
    text_bytes: int = 0
    """Bytes of text the prompt holds for sure (message contents, stripped)."""
    turns: int = 0
    """Messages the template wraps in its markers (user and assistant turns with text). The
    last one may cost less (an assistant turn there is the start of the answer), so it is
    not counted."""
    tokens: int = 0
    """Tokens known exactly (a prompt sent as token ids)."""

    def token_floor(self, *, token_bytes_max: int | None, message_tokens: int = 0) -> int:
        """A lower bound on the prompt's tokens."""
        floor = self.tokens + max(0, self.turns - 1) * message_tokens
        if token_bytes_max:
            floor += -(-self.text_bytes // token_bytes_max)
        return floor


def _text_bytes(text: str) -> int:
    # Templates may trim a message; they do not drop the rest of it.
    return len(text.strip().encode("utf-8", "surrogatepass"))


def chat_size(req: ChatRequest) -> PromptSize:
    """The size of a chat request's prompt (or of its raw prompt, sent without a template)."""
    if req.raw_prompt is not None:
        return PromptSize(text_bytes=_text_bytes(req.raw_prompt))
    text_bytes = turns = 0
    for m in req.messages:
        size = _text_bytes(m.content)
        text_bytes += size
        if size and m.role in ("user", "assistant"):
            turns += 1
    return PromptSize(text_bytes=text_bytes, turns=turns)


def completion_size(prompt: str | list[Any]) -> PromptSize:
    """The size of a completion prompt: text, token ids, or a batch of either (the
    largest counts, since each must fit on its own)."""
    if isinstance(prompt, str):
        return PromptSize(text_bytes=_text_bytes(prompt))
    if prompt and all(isinstance(t, int) for t in prompt):
        return PromptSize(tokens=len(prompt))
    sizes = [completion_size(p) for p in prompt if isinstance(p, str | list)]
    return max(sizes, key=lambda s: s.tokens + s.text_bytes, default=PromptSize())
