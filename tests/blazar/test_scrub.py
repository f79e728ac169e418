"""PII scrubbing: what must go, and the near-misses that must stay."""

from __future__ import annotations

import logging

import pytest

from blazar.telemetry.scrub import ScrubFilter, luhn_ok, scrub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+x@example.co.uk today", "write to [email] today"),
        ("Authorization: Bearer abc.DEF-123_456", "Authorization: Bearer [secret]"),
        ("curl -H 'x-api-key: sk-ant-api03-AbCdEf123456'", "curl -H 'x-api-key: [secret]'"),
        ('{"x-api-key": "hunter2hunter2"}', '{"x-api-key": "[secret]"}'),
        ("key blz-4f9a8b7c6d5e4f3a2b1c leaked", "key [secret] leaked"),
        ("OPENAI sk-proj-abcdefgh12345678", "OPENAI [secret]"),
        ("card 4111 1111 1111 1111 exp 12/29", "card [card] exp 12/29"),
        ("card 4111-1111-1111-1111.", "card [card]."),
        ("card 378282246310005 (amex)", "card [card] (amex)"),
        ("from 203.0.113.42 port 80", "from [ip] port 80"),
        ("peer 2001:db8::8a2e:370:7334 said", "peer [ip] said"),
        ("call +44 20 7946 0958 now", "call [phone] now"),
        ("call (555) 123-4567 now", "call [phone] now"),
        ("call 555-123-4567 now", "call [phone] now"),
        ("call +1-555-123-4567.", "call [phone]."),
    ],
)
def test_scrubs(text: str, expected: str) -> None:
    assert scrub(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "blazar 0.1.0 on python 3.11.9",
        "released 2024-01-15, at 12:30:45",
        "order 1234567812345678 shipped",  # 16 digits that fail Luhn
        "model qwen2.5:7b and smollm2-135m:latest",
        "listening on 127.0.0.1:11435 and [::1]:11435 and 0.0.0.0",
        "version 10.0.19045 of the kernel",
        "trace blz-1a2b3c-42 took 12.5 ms",  # a trace id, not a key
        "a sky-blue cat",
        "took 1500 ms for 4096 tokens",
        "llamacpp:prompt_tokens_total 33",
    ],
)
def test_near_misses_stay(text: str) -> None:
    assert scrub(text) == text


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert luhn_ok("79927398713")
    assert not luhn_ok("4111111111111112")
    assert not luhn_ok("1234567812345678")


def test_log_filter_scrubs_message_args_and_traceback() -> None:
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "client %s sent %s", ("a@b.io", "x"), None)
    try:
        raise ValueError("Bearer sekret-token-123")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert ScrubFilter().filter(record)
    assert record.getMessage() == "client [email] sent x"
    assert record.exc_text is not None
    assert "sekret" not in record.exc_text and "Bearer [secret]" in record.exc_text
