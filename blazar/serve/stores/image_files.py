"""The images behind ``response_format=url``: kept in memory for an hour, within a byte budget.

stable-diffusion.cpp answers base64 only, while OpenAI's SDK asks DALL-E models for URLs
by default; the gateway keeps each image it answered with a URL here and serves it at
``GET /v1/images/files/{id}`` (the same auth and ``images`` scope as the other image
routes). An image leaves when its hour is up (OpenAI's URLs last as long) or when newer
ones need the room; a restart forgets them all. Ids are random (128 bits), so one
client cannot guess another's.
"""

from __future__ import annotations

import secrets
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_TTL_S", "ImageFiles", "ImageFilesStatistics", "files_of"]

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_TTL_S = 3600.0

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp"}


class ImageFilesStatistics(msgspec.Struct, frozen=True, kw_only=True):
    files: int
    bytes: int
    max_bytes: int
    evicted: int
    """Files dropped for room before their hour was up."""


@dataclass(frozen=True, slots=True)
class _File:
    data: bytes
    content_type: str
    expires_at: float


class ImageFiles:
    """The stored images, oldest first; one owner (the web layer, on one trio thread)."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._files: OrderedDict[str, _File] = OrderedDict()
        self._bytes = 0
        self._evicted = 0

    def __repr__(self) -> str:
        return f"<ImageFiles {len(self._files)} files, {self._bytes}/{self.max_bytes} bytes>"

    def put(self, data: bytes, content_type: str) -> str:
        """Keep ``data`` and return its id (``img_<hex>.<ext>``)."""
        now = self._clock()
        self._expire(now)
        while self._files and self._bytes + len(data) > self.max_bytes:
            _, old = self._files.popitem(last=False)
            self._bytes -= len(old.data)
            self._evicted += 1
        file_id = f"img_{secrets.token_hex(16)}.{_EXTENSIONS.get(content_type, 'bin')}"
        self._files[file_id] = _File(data, content_type, now + self.ttl_s)
        self._bytes += len(data)
        return file_id

    def get(self, file_id: str) -> tuple[bytes, str] | None:
        """The image and its content type; None when unknown or expired."""
        self._expire(self._clock())
        found = self._files.get(file_id)
        return (found.data, found.content_type) if found is not None else None

    def _expire(self, now: float) -> None:
        # every file lives ttl_s, so the oldest expire first
        while self._files:
            file_id, first = next(iter(self._files.items()))
            if first.expires_at > now:
                return
            del self._files[file_id]
            self._bytes -= len(first.data)

    def statistics(self) -> ImageFilesStatistics:
        return ImageFilesStatistics(
            files=len(self._files), bytes=self._bytes, max_bytes=self.max_bytes, evicted=self._evicted
        )


_BY_OWNER: weakref.WeakKeyDictionary[object, ImageFiles] = weakref.WeakKeyDictionary()


def files_of(owner: object) -> ImageFiles:
    """The store of one runtime (the routes that fill it and the route that serves it share it)."""
    found = _BY_OWNER.get(owner)
    if found is None:
        found = _BY_OWNER[owner] = ImageFiles()
    return found
