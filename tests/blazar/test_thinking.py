"""Thinking control, sans-io: what each dialect's switch decodes to, what llama.cpp is
told for each kind of template, and what a model that cannot do it reports."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from blazar.dialects import anthropic, ollama, openai, responses, thinking
from blazar.dialects.llamacpp import engine_request
from blazar.dialects.neutral import ChatRequest, DecodeError, Message
from registry.template import reads_effort, thinking_support
from tests.synthetic_think import THINK_TEMPLATE

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ALWAYS = CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
EFFORT = CHATML.replace(
    "{% if add_generation_prompt %}",
    "{% if add_generation_prompt %}{{ 'Reasoning: ' + (reasoning_effort or 'medium') + '\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}",
)
USER = [{"role": "user", "content": "hi"}]


def _req(**kw: Any) -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content="hi")], **kw)


def test_templates_say_whether_and_how_a_model_thinks() -> None:
    assert thinking_support(THINK_TEMPLATE) == "switchable"
    assert thinking_support(ALWAYS) == "always"
    assert thinking_support(CHATML) == "none"
    assert thinking_support(None) == "none"
    assert thinking_support("{{ broken") == "none"
    assert thinking_support(EFFORT) == "switchable" and reads_effort(EFFORT)
    assert not reads_effort(THINK_TEMPLATE) and not reads_effort(None)


@pytest.mark.parametrize(
    ("req", "support", "effort", "told"),
    [
        (_req(), "switchable", False, {}),
        (_req(think=False), "switchable", False, {"chat_template_kwargs": {"enable_thinking": False}}),
        (_req(think=True), "switchable", False, {"chat_template_kwargs": {"enable_thinking": True}}),
        (
            _req(think=True, think_budget=1024),
            "switchable",
            False,
            {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_budget_tokens": 1024},
        ),
        (
            _req(think=True, think_level="low"),
            "always",
            False,
            {"reasoning_budget_tokens": thinking.LEVEL_BUDGETS["low"]},
        ),
        (_req(think=True, think_level="high"), "always", False, {}),
        (
            _req(think=True, think_level="xhigh"),
            "switchable",
            True,
            {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}},
        ),
        (_req(think=False), "always", False, {}),
        (_req(think=True, think_budget=2048), "none", False, {}),
    ],
)
def test_what_llamacpp_is_told(req: ChatRequest, support: str, effort: bool, told: dict[str, Any]) -> None:
    assert thinking.engine_fields(req, support=support, reads_effort=effort) == told
    _, body = engine_request(req, native_tools=False, thinking_support=support, think_effort=effort)
    assert {k: body[k] for k in told} == told
    assert not ({"chat_template_kwargs", "reasoning_budget_tokens"} - set(told)) & set(body)


def test_what_a_model_cannot_do_is_named_in_the_callers_words() -> None:
    on = _req(think=True, think_param="reasoning_effort")
    off = _req(think=False, think_param="thinking")
    assert thinking.unheeded(on, support="none") == ["reasoning_effort"]
    assert thinking.unheeded(off, support="none") == []  # nothing asked of it
    assert thinking.unheeded(off, support="always") == ["thinking"]
    assert thinking.unheeded(on, support="always") == thinking.unheeded(off, support="switchable") == []
    assert thinking.unheeded(_req(), support="none") == []


def test_a_relayed_body_keeps_its_own_llamacpp_fields() -> None:
    told = {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_budget_tokens": 512}
    plain = b'{"model":"m","messages":[]}'
    assert msgspec.json.decode(thinking.fields_into_body(plain, told)) == {
        "model": "m", "messages": [], **told
    }  # fmt: skip
    own = b'{"chat_template_kwargs":{"enable_thinking":false,"x":1},"reasoning_budget_tokens":9}'
    doc = msgspec.json.decode(thinking.fields_into_body(own, told))
    assert doc == {"chat_template_kwargs": {"enable_thinking": False, "x": 1}, "reasoning_budget_tokens": 9}
    assert thinking.fields_into_body(plain, {}) is plain


def _body(**kw: Any) -> bytes:
    return msgspec.json.encode({"model": "m", **kw})


def test_each_dialect_decodes_its_switch() -> None:
    chat = openai.decode_chat_request(_body(messages=USER, reasoning_effort="low"))
    assert (chat.think, chat.think_level, chat.think_param) == (True, "low", "reasoning_effort")
    off = openai.decode_chat_request(_body(messages=USER, reasoning_effort="none"))
    assert (off.think, off.think_level) == (False, None)
    with pytest.raises(DecodeError, match="reasoning_effort"):
        openai.decode_chat_request(_body(messages=USER, reasoning_effort="extreme"))

    msg = anthropic.decode_messages_request(
        _body(messages=USER, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024})
    )
    assert (msg.think, msg.think_budget, msg.think_param) == (True, 1024, "thinking")
    adaptive = anthropic.decode_messages_request(
        _body(messages=USER, max_tokens=64, thinking={"type": "adaptive"}, output_config={"effort": "max"})
    )
    assert (adaptive.think, adaptive.think_level, adaptive.think_budget) == (True, "max", None)
    with pytest.raises(DecodeError, match=r"output_config\.effort"):
        anthropic.decode_messages_request(
            _body(messages=USER, max_tokens=64, output_config={"effort": "huge"})
        )

    olla = ollama.decode_chat_request(_body(messages=USER, think="medium"))
    assert (olla.think, olla.think_level, olla.think_param) == (True, "medium", "think")
    gen = ollama.decode_generate_request(_body(prompt="hi", think=False))
    assert (gen.think, gen.think_level) == (False, None)

    resp = responses.decode_request(_body(input="hi", reasoning={"effort": "minimal"}))
    as_chat = responses.chat_request(resp, [])
    assert (as_chat.think, as_chat.think_level, as_chat.think_param) == (True, "minimal", "reasoning.effort")
