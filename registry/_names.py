"""Model names: validation and the canonical form shared by the store and the catalog."""

from __future__ import annotations

import re

from .errors import InvalidModelName

__all__ = ["canonical_name"]

# A path segment may not start with '.', which rules out '..' and keeps manifest files
# apart from the store's own hidden temp files.
_SEGMENT = r"[a-z0-9_-][a-z0-9._-]*"
_NAME = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*(?::[a-z0-9_][a-z0-9._-]*)?")
_MAX_NAME_CHARS = 200


def canonical_name(name: str) -> str:
    """Return the canonical spelling of a model name, or raise InvalidModelName.

    Names are case-insensitive and `x:latest` is the same model as `x`, so the
    canonical form is lowercase without a `:latest` tag.
    """
    candidate = name.strip().lower()
    if not candidate:
        raise InvalidModelName("model name is empty — give a name such as `smollm2-135m`")
    if len(candidate) > _MAX_NAME_CHARS or not _NAME.fullmatch(candidate):
        raise InvalidModelName(
            f"invalid model name '{name}' — use lowercase letters, digits, '.', '-', '_' and '/'"
            " (no leading '/', no '..', no '#'), optionally followed by ':tag'"
        )
    return candidate.removesuffix(":latest")
