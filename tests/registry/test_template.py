"""Which chat templates keep a system turn that comes after the first user turn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from registry.gguf import read_model_info
from registry.store import Store
from registry.template import TemplateFacts, allows_system_turns, facts_of

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ALTERNATING = (
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}[{{ message['role'] }}] {{ message['content'] }}{% endfor %}"
)
FIRST_ONLY = (
    "{% if messages[0]['role'] == 'system' %}<<SYS>>{{ messages[0]['content'] }}<</SYS>>"
    "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}{% if m['role'] != 'system' %}[{{ m['role'] }}] {{ m['content'] }}{% endif %}"
    "{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "allowed"),
    [
        (None, True),  # llama.cpp's default, ChatML
        (CHATML, True),
        (ALTERNATING, False),  # raises on the turn
        (FIRST_ONLY, False),  # silently drops it
        ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", False),  # cannot be rendered
        ("{% for m in messages %}", False),  # not a template
    ],
)
def test_probe(template: str | None, allowed: bool) -> None:
    assert allows_system_turns(template) is allowed


def test_the_test_models_template_keeps_them(real_model: Path) -> None:
    path = str(real_model)
    assert allows_system_turns(read_model_info(path).chat_template) is True


THINKING = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>{% endif %}{% endif %}"
)


def test_the_store_keeps_a_templates_facts(tmp_path: Path) -> None:
    """Found once by rendering; then read back by another process without importing Jinja."""
    facts = Store(tmp_path).template_facts(THINKING)
    assert facts == facts_of(THINKING) == TemplateFacts(system_turns=True, thinking="switchable")
    assert len(list((tmp_path / "info").glob("template-*.json"))) == 1
    probe = (
        "import sys; from pathlib import Path; from registry.store import Store\n"
        f"facts = Store(Path({str(tmp_path)!r})).template_facts({THINKING!r})\n"
        "print(facts.thinking, 'jinja2' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["switchable", "False"]
    assert Store(tmp_path).template_facts(None) == TemplateFacts()
