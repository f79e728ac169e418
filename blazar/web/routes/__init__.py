"""Every route of the daemon, by dialect and by admin area: each module decodes a request,
calls the service (``blazar.serve``) or the runtime, and encodes the answer.

The ``gateway_served()`` modules have hot routes the gateway layer serves itself, straight
on ASGI (``register_routes``); the ``framework_served()`` modules register the rest on the
Quart app (``register``). A new route goes in the module of its dialect or area, and a new
module in the list that serves it.

Nothing is imported here: the daemon imports the gateway's own modules first and answers
with them while the framework's (Quart's) are still being imported (``blazar.web.front``),
so importing one module must not pull in the others. The gateway-served modules import
Quart only inside what the framework runs.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["framework_served", "gateway_served"]


def gateway_served() -> tuple[ModuleType, ...]:
    """The modules whose routes the gateway layer serves itself (no framework): the
    inference routes, and ``GET /health``."""
    from blazar.web.routes import control, decisions, llamacpp, native, ollama, vectors
    from blazar.web.routes.anthropic import messages
    from blazar.web.routes.openai import audio, chat, images, responses, videos

    return (
        native,
        chat,
        ollama,
        messages,
        responses,
        audio,
        images,
        videos,
        llamacpp,
        vectors,
        decisions,
        control,
    )


def framework_served() -> tuple[ModuleType, ...]:
    """The modules that register routes on the Quart app, in the order they are registered."""
    from blazar.web.console import api as console_api
    from blazar.web.console import page as console_page
    from blazar.web.routes import adapters, discovery, federation, native, ollama, requests, streams
    from blazar.web.routes.admin import (
        bench,
        capacity,
        config,
        diagnostics,
        doctor,
        engines,
        failover,
        jobs,
        lifecycle,
        mcp,
        multinode,
        pool,
        sessions,
        telemetry,
        tune,
    )
    from blazar.web.routes.anthropic import batches as anthropic_batches
    from blazar.web.routes.anthropic import messages
    from blazar.web.routes.openai import (
        audio,
        batches,
        chat,
        conversations,
        images,
        realtime,
        responses,
        stored,
        videos,
    )

    return (
        native,
        streams,
        discovery,
        adapters,
        engines,
        requests,
        chat,
        messages,
        ollama,
        lifecycle,
        config,
        sessions,
        mcp,
        failover,
        federation,
        pool,
        multinode,
        capacity,
        diagnostics,
        responses,
        stored,
        conversations,
        jobs,
        batches,
        anthropic_batches,
        telemetry,
        console_api,
        console_page,
        audio,
        images,
        videos,
        realtime,
        doctor,
        bench,
        tune,
    )
