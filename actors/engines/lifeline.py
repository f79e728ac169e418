"""The thread that ties an engine child's life to the daemon's.

The daemon holds the write end of the child's stdin and never writes to it, so
end-of-file on stdin means the daemon is gone — whatever killed it, ``kill -9``
included. Used by the llama.cpp host and by the watchdog around binaries.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["on_parent_exit"]


def on_parent_exit(action: Callable[[], None]) -> None:
    """Run ``action`` (in a daemon thread) once stdin reaches end-of-file."""

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        action()

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
