"""The thread that ties an engine child's life to the daemon's.

The daemon holds the write end of the child's stdin and never writes to it, so
end-of-file on stdin means the daemon is gone — whatever killed it, ``kill -9``
included. Used by the llama.cpp host and by the watchdog around binaries.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

__all__ = ["host_lifetime", "on_parent_exit"]


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


def host_lifetime() -> threading.Event:
    """A host's lifetime: the event SIGTERM or SIGINT sets (stop politely), and an exit at once
    when the daemon is gone (stdin closed; not when run by hand from a terminal)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if not os.isatty(0):
        on_parent_exit(lambda: os._exit(0))
    return stop
