"""The compact catalog's meta-calls as the gateway answers them (``blazar/serve/mcp_compact.py``):
a search, a schema, a call turned into the real tool's; and the request's header."""

from __future__ import annotations

import json

import pytest

from blazar.dialects.neutral import ToolCall
from blazar.errors import BlazarError
from blazar.serve.mcp_compact import CALL, FIND, SCHEMA, Compact, Lookup, parse_catalog
from tests.actors.test_mcp_catalog import TOOLS


def _call(meta: str, /, **arguments: object) -> ToolCall:
    return ToolCall(id="call_1", name=meta, arguments=json.dumps(arguments))


def test_compact_answers_lookups_and_turns_a_call_into_the_tool() -> None:
    c = Compact(TOOLS, ["cal", "sky", "files", "disk"])
    assert [s.name for s in c.specs()] == [FIND, SCHEMA, CALL] and "6 tools" in (
        c.specs()[0].description or ""
    )
    found = c.answer(_call(FIND, query="weather"))
    assert isinstance(found, Lookup) and found.ok
    assert found.text.splitlines()[0] == "- mcp__sky__getWeather(city): Current weather for a city."
    schema = c.answer(_call(SCHEMA, name="forecast"))
    assert isinstance(schema, Lookup) and '"days":{"type":"integer"}' in schema.text
    run = c.answer(_call(CALL, name="forecast", arguments={"city": "Oslo", "days": 2}))
    assert run == ToolCall(id="call_1", name="mcp__sky__forecast", arguments='{"city": "Oslo", "days": 2}')
    as_text = c.answer(_call(CALL, name="sky/forecast", arguments='{"city": "Oslo"}'))
    assert isinstance(as_text, ToolCall) and json.loads(as_text.arguments) == {"city": "Oslo"}
    for bad, says in [
        (
            _call(CALL, name="read_file", arguments={}),
            "did you mean: mcp__files__read_file, mcp__disk__",
        ),
        (_call(CALL, arguments={}), 'needs "name"'),
        (_call(CALL, name="forecast", arguments=[1]), "must be an object"),
        (ToolCall(id="c", name=SCHEMA, arguments="not json"), "must be a JSON object"),
        (_call(FIND, query="zebra"), "no tool matches 'zebra'; the tools are: mcp__cal__create_event"),
    ]:
        got = c.answer(bad)
        assert isinstance(got, Lookup) and not got.ok and says in got.text, got


def test_the_request_header_is_compact_or_full() -> None:
    assert (
        parse_catalog(None) is None
        and parse_catalog(" Compact ") == "compact"
        and parse_catalog("full") == "full"
    )
    with pytest.raises(BlazarError) as refused:
        parse_catalog("tiny")
    assert refused.value.code == "BAD_REQUEST"
