"""Chat steered by control vectors (``POST /v1/chat/completions/control``), as the service runs it.

The runtime gives the engine that runs the model with the request's set of vectors
(``actors/control.py``: an engine of its own per set, started by the first request that asks
for it); the request's chat body is then relayed to that engine as plain chat is
(``blazar.serve.openai_chat.relay``): its model settings, output cap, the claim, the stream.
What needs another path than the engine's own bytes (a failover chain, candidates, an MCP
loop, tools the model's template does not know) is refused here rather than run unsteered.
"""

from __future__ import annotations

from actors.control import Choice, steered_engine
from actors.runtime import Runtime
from blazar.auth.keys import ADMIN
from blazar.dialects.control import Steering
from blazar.dialects.neutral import ChatRequest
from blazar.errors import BlazarError
from blazar.serve import engine_call, mcp_loop, openai_chat
from blazar.serve.candidates import fanout
from blazar.serve.context import Ask, Relayed
from blazar.serve.policy import certified, honesty
from blazar.serve.reply import Reply

__all__ = ["answer_steered"]


def _refuse(what: str, param: str) -> BlazarError:
    return BlazarError(
        "BAD_REQUEST",
        f"{what} cannot be steered by control vectors — send it without `{param}`, "
        "or without `control_vectors` to POST /v1/chat/completions",
        param=param,
    )


async def answer_steered(
    runtime: Runtime, call: Relayed, ask: Ask, req: ChatRequest, steering: Steering
) -> Reply:
    """``req`` (``call.body`` without its steering fields) on the engine steered by ``steering``."""
    strict = ask.is_strict(runtime.config.strict)
    honesty.refuse_ignored(req.ignored, strict=strict)
    if req.model in runtime.failover.chains:
        raise _refuse(f"'{req.model}' is a failover chain, whose targets", "model")
    if (
        any(v.path is not None for v in steering.vectors)
        and ask.grant is not None
        and not ask.grant.allows_family(ADMIN)
    ):
        raise BlazarError(
            "KEY_SCOPE_FORBIDDEN",
            "a control vector given by `path` reads a file on the daemon's machine: that needs an admin key "
            "— add the vector to the model (`blazar control add`) and name it instead",
            param="control_vectors",
        )
    if fanout.asked(call, completions=False):
        raise _refuse("a request for several candidates", "n")
    if mcp_loop.selected_servers(runtime, call):
        raise _refuse("a request with MCP tools", "mcp")
    choices = [Choice(name=v.name, path=v.path, strength=v.strength) for v in steering.vectors]
    engine = await steered_engine(runtime, req.model, choices, steering.layers)
    engine_call.check_images(req, engine)
    certified.refuse_failed(runtime, engine.spec.alias or engine.spec.model, certified.chat_needs(req), ask)
    if openai_chat.emulates_tools(req, engine):
        raise _refuse(f"model '{req.model}' knows no tools in its template: a request with tools", "tools")
    return await openai_chat.relay_chat(runtime, call, ask, req, engine, strict=strict)
