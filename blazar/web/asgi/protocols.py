"""hypercorn's HTTP/2 protocol and WebSocket stream, imported when first needed.

hypercorn imports its HTTP/2 protocol (h2, hpack: a tenth of what the daemon imports before
it listens) and its WebSocket stream (wsproto) along with its HTTP/1.1 protocol. Over plain
HTTP a daemon needs neither until a client upgrades (h2c, a WebSocket), so ``defer`` puts a
stand-in in place of each module, before anything imports hypercorn's protocols; the class
it names imports the real module when it is first made. The listener imports HTTP/2's
before it listens with TLS, where clients ask for it (``load_http2``). Where hypercorn's
protocols were imported already, nothing changes.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["defer", "load_http2"]

_HTTP2 = "hypercorn.protocol.h2"
_DEFERRED: dict[str, _Deferred] = {}


class _Deferred:
    """Stands for class ``name`` of ``module``: makes one, importing the module the first time."""

    def __init__(self, module: str, name: str) -> None:
        self._module = module
        self._name = name
        self._real: types.ModuleType | None = None

    def load(self) -> types.ModuleType:
        if self._real is None:
            stand_in = sys.modules.pop(self._module)
            try:
                self._real = importlib.import_module(self._module)
            except BaseException:
                sys.modules[self._module] = stand_in
                raise
        return self._real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.load(), self._name)(*args, **kwargs)


def defer() -> None:
    """Install the stand-ins, unless hypercorn's protocols are imported already."""
    if "hypercorn.protocol" in sys.modules or _DEFERRED:
        return
    for module, name in ((_HTTP2, "H2Protocol"), ("hypercorn.protocol.ws_stream", "WSStream")):
        stand_in = types.ModuleType(module)
        _DEFERRED[module] = deferred = _Deferred(module, name)
        setattr(stand_in, name, deferred)
        sys.modules[module] = stand_in


def load_http2() -> None:
    """Import the HTTP/2 protocol now if it was deferred."""
    if (deferred := _DEFERRED.get(_HTTP2)) is not None:
        deferred.load()
