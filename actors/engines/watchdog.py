"""Run an engine binary so that it dies with the daemon.

``python -m actors.engines.watchdog BINARY ARGS…`` starts the binary with
``PR_SET_PDEATHSIG`` (from this process's main thread, which lives as long as
we do), forwards TERM/INT to it, and kills it when our stdin reaches
end-of-file — which happens when the daemon dies, even by ``kill -9``.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys

from actors.engines.lifeline import on_parent_exit

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m actors.engines.watchdog BINARY [ARGS…]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    on_parent_exit(child.kill)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
