"""A prompt sure not to fit one slot's context is refused before the engine is asked to template it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.engines.llamacpp import LaunchSpec
from blazar.dialects.neutral import ChatRequest, Message
from blazar.dialects.prompt_size import PromptSize, chat_size, completion_size
from blazar.errors import BlazarError, Dialect
from blazar.serve.policy import prompt_fit


@dataclass
class _Engine:
    """What the check reads of an engine actor."""

    spec: LaunchSpec
    served_ctx: int | None = None


SPEC = LaunchSpec(model="smol", path="/m.gguf", ctx_per_slot=4096, slots=4, token_bytes_max=81)
ENGINE: Any = _Engine(SPEC)


def _chat(contents: list[str], role: str = "user") -> ChatRequest:
    return ChatRequest(model="smol", messages=[Message(role=role, content=c) for c in contents])  # type: ignore[arg-type]


def test_a_hundred_thousand_words_cannot_fit_4096_tokens() -> None:
    size = chat_size(_chat(["hello"] * 100_000))
    assert size.text_bytes == 500_000 and size.turns == 100_000
    with pytest.raises(BlazarError) as info:
        prompt_fit.refuse_if_too_long(ENGINE, size)
    assert info.value.code == "PROMPT_TOO_LONG"
    assert info.value.message.startswith("prompt is too long: at least 6173 tokens > 4096 maximum — ")
    assert "at least 6173 tokens" in info.value.message_for(Dialect.OPENAI)
    assert "maximum context length is 4096 tokens" in info.value.message_for(Dialect.OPENAI)
    assert prompt_fit.template_byte_cap(ENGINE) == 4096 * 81
    # What the engine really serves counts, not what it was asked for.
    prompt_fit.refuse_if_too_long(_Engine(SPEC, served_ctx=8192), chat_size(_chat(["hello"] * 80_000)))  # type: ignore[arg-type]


def test_an_ordinary_prompt_passes() -> None:
    prompt_fit.refuse_if_too_long(ENGINE, chat_size(_chat(["What is the weather in Paris?"] * 10)))
    # Unknown vocabulary: nothing is refused on bytes alone.
    unknown: Any = _Engine(LaunchSpec(model="x", path="/x.gguf", ctx_per_slot=16, slots=1))
    prompt_fit.refuse_if_too_long(unknown, chat_size(_chat(["word " * 1000])))


@given(st.lists(st.text(), max_size=20), st.integers(min_value=1, max_value=200))
def test_the_floor_never_exceeds_a_tokenization_into_the_longest_tokens(
    texts: list[str], longest: int
) -> None:
    # Any tokenization covers each message's bytes with tokens of at most `longest` bytes.
    size = chat_size(_chat(texts))
    fewest = sum(-(-len(t.strip().encode("utf-8", "surrogatepass")) // longest) for t in texts)
    assert size.token_floor(token_bytes_max=longest) <= fewest


def test_completion_prompts() -> None:
    assert completion_size("abc").text_bytes == 3
    assert completion_size([1, 2, 3]).tokens == 3
    assert completion_size(["a", "abcdef"]).text_bytes == 6  # each prompt of a batch must fit alone
    raw = ChatRequest(model="m", messages=[], raw_prompt="x" * 100)
    assert chat_size(raw) == PromptSize(text_bytes=100)


class _FakeHandle:
    """The engine's template and tokenizer: ChatML, one token per marker, word or newline."""

    def __init__(self) -> None:
        self.calls = 0
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(self._answer), base_url="http://engine")

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        body: dict[str, Any] = json.loads(request.content)
        if request.url.path == "/apply-template":
            messages = body["messages"]
            turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            if messages[-1]["role"] == "assistant":  # taken as the start of the answer, as llama.cpp does
                return httpx.Response(200, json={"prompt": turns.removesuffix("<|im_end|>\n")})
            return httpx.Response(200, json={"prompt": turns + "<|im_start|>assistant\n"})
        text = (
            body["content"].replace("<|im_start|>", " S ").replace("<|im_end|>", " E ").replace("\n", " N ")
        )
        return httpx.Response(200, json={"tokens": list(range(len(text.split())))})


async def test_many_short_turns_are_refused_with_the_templates_own_cost() -> None:
    handle = _FakeHandle()
    spec = LaunchSpec(model="chatml", path="/chatml.gguf", ctx_per_slot=4096, slots=1, token_bytes_max=81)
    engine: Any = _Engine(spec)
    size = chat_size(_chat(["a", "b"] * 50_000))
    prompt_fit.refuse_if_too_long(engine, size)  # 100 KB of text alone could be 1,235 tokens
    with pytest.raises(BlazarError) as info:
        await prompt_fit.check_prompt(engine, handle, size)  # type: ignore[arg-type]
    # Each turn but the last costs <|im_start|>, the role, a newline, <|im_end|> and a newline.
    assert "at least 501230 tokens > 4096 maximum" in info.value.message
    probes = handle.calls
    with pytest.raises(BlazarError):
        await prompt_fit.check_prompt(engine, handle, size)  # type: ignore[arg-type]
    assert handle.calls == probes  # measured once per model
    # A conversation of a few turns is not worth a measurement.
    await prompt_fit.check_prompt(engine, handle, chat_size(_chat(["hi"] * 20)))  # type: ignore[arg-type]
    assert handle.calls == probes
