"""A compact catalog of MCP tools: find them by keywords, name one loosely, sum one up.

Pure functions over ``McpTool`` lists (no I/O, no trio), for a model that is shown a few
meta-tools instead of every schema (docs/mcp.md, compact catalogs). ``rank`` is Okapi BM25
over each tool's name (counted twice: a name is the densest description there is), its
server, its argument names and its description; words are split at case changes,
underscores, dashes and digits, lowercased, and lightly stemmed, so ``getWeather``,
``get_weather`` and "weathers" meet.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from actors.mcp_results import McpTool, split_qualified

__all__ = ["rank", "resolve", "signature", "summary", "words"]

_K1 = 1.2
_B = 0.75
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_STOP = frozenset(
    "a an and any are as at be by can do for from get give how i in is it me my of on or please "
    "the this that to tool tools use using what which with you your".split()
)


def _stem(word: str) -> str:
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + keep
    return word


def words(text: str) -> list[str]:
    """``text``'s search terms: split at case changes and non-letters, lowercased, stemmed,
    common filler words dropped."""
    out = []
    for raw in _WORD.findall(text):
        w = raw.lower()
        if w not in _STOP:
            out.append(_stem(w))
    return out


def _properties(tool: McpTool) -> dict[str, Any]:
    props = tool.input_schema.get("properties")
    return props if isinstance(props, dict) else {}


def _document(tool: McpTool) -> list[str]:
    return [
        *words(tool.name),
        *words(tool.name),
        *words(tool.server),
        *(w for p in _properties(tool) for w in words(p)),
        *words(tool.description or ""),
    ]


def rank(tools: list[McpTool], query: str, limit: int = 5) -> list[McpTool]:
    """The ``limit`` tools that best match ``query`` (BM25), best first; none for a query
    that shares no word with any tool. Ties keep the tools' own order."""
    terms = list(dict.fromkeys(words(query)))
    if not terms or not tools or limit <= 0:
        return []
    docs = [Counter(_document(t)) for t in tools]
    lengths = [sum(d.values()) for d in docs]
    average = sum(lengths) / len(docs) or 1.0
    n = len(docs)
    idf = {}
    for term in terms:
        df = sum(1 for d in docs if term in d)
        idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scored = []
    for i, (doc, length) in enumerate(zip(docs, lengths, strict=True)):
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if tf:
                score += idf[term] * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * length / average))
        if score > 0:
            scored.append((-score, i))
    scored.sort()
    return [tools[i] for _, i in scored[:limit]]


def resolve(tools: list[McpTool], name: str) -> tuple[McpTool | None, list[McpTool]]:
    """The tool ``name`` means, and else the tools it might mean (for the model's next try).

    ``name`` may be the offered name (``mcp__files__read``), ``files__read``, ``files/read``,
    ``files.read`` or the bare tool name when one server alone has it; case is ignored
    when nothing matches exactly."""
    name = name.strip()
    for t in tools:
        if t.qualified == name:
            return t, []
    parts = split_qualified(name)
    server: str | None = None
    tool = name
    if parts is not None:
        server, tool = parts
    else:
        for sep in ("__", "/", "."):
            head, found, tail = name.partition(sep)
            if found and head and tail:
                server, tool = head, tail
                break
    for fold in (False, True):

        def same(a: str, b: str, fold: bool = fold) -> bool:
            return a.lower() == b.lower() if fold else a == b

        hits = [t for t in tools if same(t.name, tool) and (server is None or same(t.server, server))]
        if len(hits) == 1:
            return hits[0], []
        if hits:
            return None, hits
        if server is not None:  # a name with a server part may still be a bare tool name
            bare = [t for t in tools if same(t.name, name)]
            if len(bare) == 1:
                return bare[0], []
    return None, rank(tools, name, 3)


def signature(tool: McpTool) -> str:
    """``mcp__s__t(a, b?)``: the name to call and its arguments (``?``: optional)."""
    required = tool.input_schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    args = ", ".join(p if p in needed else f"{p}?" for p in _properties(tool))
    return f"{tool.qualified}({args})"


def summary(tool: McpTool, width: int = 160) -> str:
    """The tool's signature and the first sentence of its description, cut to ``width``."""
    text = " ".join((tool.description or "").split())
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if len(first) > width:
        first = first[: width - 1].rstrip() + "…"
    return f"{signature(tool)}: {first}" if first else signature(tool)
