"""A Python client for the Blazar daemon, on the standard library alone.

``Client`` (blocking, ``urllib``) and ``AsyncClient`` (``asyncio``) call the same routes and
return the same typed results; every failure is a ``BlazarError``. The realtime voice loop
needs the ``realtime`` extra (``websockets``).
"""

from __future__ import annotations

from ._async import AsyncClient, AsyncStream
from ._errors import BlazarError
from ._sync import ByteStream, Client, Stream
from ._types import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatMessage,
    Embeddings,
    Explanation,
    FailoverChain,
    FailoverTarget,
    Job,
    JobPage,
    JobResult,
    Meta,
    Model,
    PullProgress,
    RequestCard,
    Response,
    ResponseEvent,
    RunningModel,
    Setting,
    Speech,
    Story,
    ToolCall,
    Transcription,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncStream",
    "BlazarError",
    "ByteStream",
    "ChatChoice",
    "ChatChunk",
    "ChatCompletion",
    "ChatMessage",
    "Client",
    "Embeddings",
    "Explanation",
    "FailoverChain",
    "FailoverTarget",
    "Job",
    "JobPage",
    "JobResult",
    "Meta",
    "Model",
    "PullProgress",
    "RequestCard",
    "Response",
    "ResponseEvent",
    "RunningModel",
    "Setting",
    "Speech",
    "Story",
    "Stream",
    "ToolCall",
    "Transcription",
    "Usage",
]
