"""The `gguf` package's constants (key names, value types, quant block sizes), alone.

``import gguf.constants`` first runs ``gguf/__init__``, which imports the
package's reader, writer and vocabulary code, and with them numpy and yaml:
about a tenth of a second, on the way to every engine start (the daemon reads a
model's header before it spawns the engine). Reading a header needs only the
constants module, which imports nothing but the standard library, so it is
loaded here from the package's file, as a module of its own. The package proper
is left alone: a program that imports it as well gets its own copy of the
constants, equal in value (the quant and value types are ``IntEnum``s).

This package's modules write ``from ._gguf_constants import constants as _gg``,
never ``import gguf.constants``, which would import the whole package.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["constants"]

_NAME = "registry._gguf_constants.constants"


def _load() -> ModuleType:
    package = importlib.util.find_spec("gguf")  # finds the package without running it
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    folder = Path(next(iter(package.submodule_search_locations)))
    spec = importlib.util.spec_from_file_location(_NAME, folder / "constants.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no constants module in the gguf package at {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # enum and dataclass machinery look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return module


if TYPE_CHECKING:
    import gguf.constants as constants
else:
    constants = _load()
