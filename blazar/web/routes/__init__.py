"""Every route of the daemon, by dialect and by admin area: each module decodes a request,
calls the service (``blazar.serve``) or the runtime, and encodes the answer.

``GATEWAY_SERVED`` modules have hot POST routes the gateway layer serves itself, straight
on ASGI (``register_routes``); ``FRAMEWORK_SERVED`` modules register the rest on the Quart
app (``register``). A new route goes in the module of its dialect or area, and a new module
in the tuple that serves it.
"""

from __future__ import annotations

from blazar.web.console import api as console_api
from blazar.web.console import page as console_page
from blazar.web.routes import (
    adapters,
    control,
    decisions,
    discovery,
    federation,
    llamacpp,
    native,
    ollama,
    requests,
    streams,
    vectors,
)
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

__all__ = ["FRAMEWORK_SERVED", "GATEWAY_SERVED"]

GATEWAY_SERVED = (
    chat, ollama, messages, responses, audio, images, videos, llamacpp, vectors, decisions, control
)  # fmt: skip
"""The modules whose inference routes the gateway layer serves itself (no framework)."""

FRAMEWORK_SERVED = (
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
"""The modules that register routes on the Quart app, in the order they are registered."""
