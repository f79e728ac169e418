"""Strict mode and the parameter report headers (blazar.serve.policy.honesty), without a daemon."""

from __future__ import annotations

import pytest

from blazar.errors import BlazarError, Dialect
from blazar.serve.context import Ask
from blazar.serve.policy import honesty
from blazar.web.asgi.ask import ask_of
from blazar.web.asgi.call import Call


def _call(headers: dict[str, str]) -> Call:
    scope = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    return Call(scope, trace_id="t", max_body=1)


@pytest.mark.parametrize(
    ("value", "strict"), [("1", True), ("true", True), ("On", True), ("0", False), ("", False)]
)
def test_the_header_asks_for_strict_mode(value: str, strict: bool) -> None:
    ask = ask_of(_call({"x-blazar-strict": value}))
    assert ask.is_strict(False) is strict
    assert ask.is_strict(True) is True  # the config's strict mode cannot be turned off per request


def test_outside_a_request_only_the_config_counts() -> None:
    assert Ask.job().is_strict(False) is False and Ask.job().is_strict(True) is True


def test_ignored_parameters_are_refused_only_in_strict_mode() -> None:
    honesty.refuse_ignored(["user"], strict=False)
    honesty.refuse_ignored([], strict=True)
    with pytest.raises(BlazarError) as err:
        honesty.refuse_ignored(["user", "options.num_gpu"], strict=True)
    assert err.value.code == "PARAMETER_IGNORED" and err.value.param == "user"
    assert "user, options.num_gpu" in err.value.message


def test_an_output_limit_above_the_context_is_capped_or_refused() -> None:
    assert honesty.output_limit(None, 4096, param="max_tokens", model="m", strict=True) is None
    assert honesty.output_limit(4096, 4096, param="max_tokens", model="m", strict=True) is None
    assert honesty.output_limit(5000, 4096, param="max_tokens", model="m", strict=False) == 4096
    with pytest.raises(BlazarError) as err:
        honesty.output_limit(5000, 4096, param="max_tokens", model="m", strict=True)
    assert err.value.code == "PARAMETER_CHANGED"
    assert err.value.message_for(Dialect.OPENAI).startswith("max_tokens is too large: 5000.")
    assert err.value.message_for(Dialect.ANTHROPIC).startswith("max_tokens: 5000 > 4096, which is")


def test_the_report_headers() -> None:
    headers: dict[str, str] = {}
    honesty.report(headers, ignored=["a", "options.b"], changed=["max_tokens=4096"], context=4096)
    assert headers == {
        "X-Blazar-Ignored": "a,options.b",
        "X-Blazar-Changed": "max_tokens=4096",
        "X-Blazar-Context": "4096",
        "X-Blazar-Warnings": "params_ignored,params_changed",
    }
    empty: dict[str, str] = {}
    honesty.report(empty, ignored=[], changed=[], context=None)
    assert empty == {}
