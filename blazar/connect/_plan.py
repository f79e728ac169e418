"""The types every tool module returns: what it would write, and the request that proves it works."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = ["ConnectError", "Context", "Plan", "Probe", "Tool", "config_home"]

Answer = Literal["json", "sse-chat", "sse-responses", "sse-anthropic", "ndjson"]
"""How a probe's answer is read: a plain JSON body, or a stream and the marker that ends it well."""


class ConnectError(Exception):
    """A tool's config cannot be planned or changed (a file that does not parse, …)."""


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a plan depends on: no module reads the machine itself."""

    home: Path
    env: Mapping[str, str]
    base_url: str
    """The daemon's root URL, without ``/v1``."""
    key: str
    """The API key the tool sends (any word while the daemon has no keys)."""
    key_given: bool = False
    """The key was given by the user (else a placeholder): a tool that can take it from the
    environment is told to, instead of writing a secret into its file."""
    models: tuple[str, ...]
    """The models to offer, best first (at least one)."""

    @property
    def v1(self) -> str:
        return self.base_url.rstrip("/") + "/v1"

    @property
    def model(self) -> str:
        return self.models[0]


class Probe(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the tool sends it: same route, headers and body shape (answers kept short)."""

    method: str
    path: str
    headers: dict[str, str] = {}
    body: dict[str, Any] | None = None
    answer: Answer = "json"


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    path: Path | None
    """The file changed; None for a tool whose settings live where no file can be edited."""
    old_text: str | None
    """The file as it is now (None: it does not exist)."""
    new_text: str | None
    """The file after the change (None: nothing to write, the summary says what to enter)."""
    summary: list[str]
    probes: list[Probe]
    models: list[str]

    @property
    def writes(self) -> bool:
        return self.path is not None and self.new_text is not None and self.new_text != self.old_text


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One supported tool: how it is found, where its config lives, how its plan is made."""

    name: str
    title: str
    binaries: tuple[str, ...]
    """Commands whose presence on PATH means the tool is installed."""
    markers: tuple[str, ...]
    """Paths under the home directory whose presence means the same (globs allowed)."""
    path: Callable[[Path, Mapping[str, str]], Path | None]
    """Where its config file is (home, environment); None: it has none to edit."""
    plan: Callable[[Context, str | None], Plan]
    """The plan, given the file's text now (None: no file yet)."""
    first_turn_tokens: int | None = None
    """Tokens of the tool's first real turn (system prompt, tool schemas, a short question) as
    it sends it with the settings connect writes; None: never measured. ``blazar connect``
    warns when that and room for an answer exceed the model's context per slot."""
    output_cap: int | None = None
    """The ``max_output_tokens`` connect sets on the daemon for the tool's models, because its
    requests name no output limit and a small model could otherwise generate until its context
    is full; None: the tool sends its own (or a cap would fail its turns)."""


def config_home(home: Path, env: Mapping[str, str]) -> Path:
    """XDG's config directory (``$XDG_CONFIG_HOME`` or ``~/.config``)."""
    xdg = env.get("XDG_CONFIG_HOME")
    return Path(xdg) if xdg and os.path.isabs(xdg) else home / ".config"
