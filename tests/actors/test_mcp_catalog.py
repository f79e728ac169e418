"""The compact catalog's pure parts: ranking tools by keywords, naming one loosely, summing
one up; and which servers are compact (``catalog``, ``mcp_catalog``)."""

from __future__ import annotations

import msgspec
import pytest

from actors.config import McpServer, Tunables
from actors.mcp import McpServers
from actors.mcp_catalog import rank, resolve, signature, summary, words
from actors.mcp_results import McpTool, qualified_name


def tool_of(server: str, name: str, description: str, **props: str) -> McpTool:
    schema = {
        "type": "object",
        "properties": {p: {"type": t} for p, t in props.items()},
        "required": [*props][:1],
    }
    return McpTool(
        server=server,
        name=name,
        qualified=qualified_name(server, name),
        description=description,
        input_schema=schema,
    )


TOOLS = [
    tool_of("cal", "create_event", "Create an event in the calendar.", title="string", start="string"),
    tool_of("cal", "list_events", "List the calendar's events.", day="string"),
    tool_of("sky", "getWeather", "Current weather for a city. Temperatures in degrees.", city="string"),
    tool_of("sky", "forecast", "The weather of the coming days.", city="string", days="integer"),
    tool_of("files", "read_file", "Read a file's text.", path="string"),
    tool_of("disk", "read_file", "Read a file from the backup disk.", path="string"),
]


def test_words_split_case_and_separators_and_stem() -> None:
    assert words("getWeather") == ["weather"]  # "get" is filler
    assert words("list_events in the HTTPServer") == ["list", "event", "http", "server"]
    assert words("Weathers") == ["weather"]


def test_rank_finds_by_name_description_and_arguments() -> None:
    assert [t.name for t in rank(TOOLS, "weather", 2)] == ["getWeather", "forecast"]
    assert rank(TOOLS, "calendar event")[0].name in ("create_event", "list_events")
    assert (
        rank(TOOLS, "new event")[0].name == "create_event" or rank(TOOLS, "create")[0].name == "create_event"
    )
    assert rank(TOOLS, "city")[0].server == "sky"  # an argument's name counts
    assert rank(TOOLS, "days forecast", 1)[0].name == "forecast"
    assert rank(TOOLS, "the of") == [] and rank(TOOLS, "zebra") == []
    assert len(rank(TOOLS, "read file", 10)) == 2


def test_resolve_takes_loose_names_and_says_what_was_meant() -> None:
    assert resolve(TOOLS, "mcp__sky__forecast")[0] is TOOLS[3]
    assert resolve(TOOLS, "forecast")[0] is TOOLS[3]
    assert resolve(TOOLS, "sky/getWeather")[0] is TOOLS[2]
    assert resolve(TOOLS, "sky.getweather")[0] is TOOLS[2]  # case folded when nothing is exact
    assert resolve(TOOLS, "disk__read_file")[0] is TOOLS[5]
    tool, near = resolve(TOOLS, "read_file")  # two servers have it: both are offered back
    assert tool is None and {t.server for t in near} == {"files", "disk"}
    tool, near = resolve(TOOLS, "weather")
    assert tool is None and near[0].name == "getWeather"
    assert resolve(TOOLS, "nothing like it") == (None, [])


def test_signature_and_summary_are_short() -> None:
    assert signature(TOOLS[3]) == "mcp__sky__forecast(city, days?)"
    assert summary(TOOLS[2]) == "mcp__sky__getWeather(city): Current weather for a city."
    long = tool_of("x", "t", "word " * 100)
    assert len(summary(long, 60)) == 60 + len(signature(long)) + 2 and summary(long, 60).endswith("…")


def test_the_catalog_is_chosen_per_server_then_by_default() -> None:
    servers = [
        McpServer(name="a", command=["x"]),
        McpServer(name="b", command=["x"], catalog="compact"),
        McpServer(name="c", command=["x"], catalog="full"),
    ]
    group = McpServers(servers, "all", "full")
    assert [group.catalog(n) for n in "abc"] == ["full", "compact", "full"]
    group = McpServers(servers, "all", "compact")
    assert [group.catalog(n) for n in "abc"] == ["compact", "compact", "full"]
    assert msgspec.convert({"mcp_catalog": "compact"}, Tunables).mcp_catalog == "compact"
    for wrong in ({"mcp_catalog": "small"}, {"mcp": [{"name": "d", "command": ["x"], "catalog": "tiny"}]}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(wrong, Tunables)
