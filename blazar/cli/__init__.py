"""The ``blazar`` command line.

Every failing command prints one line that says what went wrong and what to run next, and
exits non-zero; tracebacks only with ``BLAZAR_DEBUG=1``.

The commands live by theme in ``serving``, ``models``, ``fit``, ``disk``, ``keys``, ``config`` and
``connect``; each registers itself on ``app`` (``_app``) when imported. Shared helpers are in
``_common``. ``app`` is built on first use: ``main`` first tries ``blazar.entry``'s quick
paths, which need none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blazar.entry import main
from blazar.entry import one_line as _one_line

if TYPE_CHECKING:
    from blazar.cli._app import app

__all__ = ["_one_line", "app", "main"]


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module 'blazar.cli' has no attribute {name!r}")
    from blazar.cli._app import app

    globals()["app"] = app  # later lookups skip this function
    return app
