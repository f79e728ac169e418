"""A model's shape before downloading it: the GGUF header read from the Hub by Range requests.

`blazar fit hf.co/ORG/REPO:QUANT` (or a catalog name not installed yet) resolves the
file the same way a pull would, then fetches only the first bytes: a header is
usually well under a few MiB, even with a large vocabulary.
"""

from __future__ import annotations

import httpx
import msgspec

from ._download import Fetch, RetryPolicy
from ._hf import resolve_hf
from ._names import canonical_name
from .catalog import Catalog, HfSource
from .errors import PullFailed
from .gguf import GGUFHeader
from .shape import ModelShape, PrefixReader, shape_from_header

__all__ = ["remote_shape"]

_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


async def _header(client: httpx.AsyncClient, fetch: Fetch) -> GGUFHeader:
    """Fetch the start of the file until its GGUF header is whole."""
    reader = PrefixReader(total_size=fetch.size)
    while (wanted := reader.next_range()) is not None:
        start, end = wanted
        resp = await client.get(fetch.url, headers={**fetch.headers, "Range": f"bytes={start}-{end - 1}"})
        if resp.status_code not in (200, 206):
            raise PullFailed(f"{fetch.label}: HTTP {resp.status_code} while reading its header")
        reader.feed(resp.content if resp.status_code == 206 else resp.content[start:end])
    assert reader.header is not None
    return reader.header


async def remote_shape(
    name: str, catalog: Catalog, *, retry: RetryPolicy | None = None
) -> tuple[ModelShape, str]:
    """The shape of the model `name` (a catalog name or a Hugging Face reference) and the
    file it was read from (``hf:ORG/REPO/FILE``); every part of a split model counts."""
    entry = catalog.get(name)
    ref = name
    if entry is not None:
        hf = next((s for s in entry.sources if isinstance(s, HfSource)), None)
        if hf is None:
            raise PullFailed(f"'{entry.name}' has no Hugging Face source to read its header from")
        ref = hf.ref()
    plan = await resolve_hf(ref, canonical_name(name), catalog, retry or RetryPolicy())
    # Authorization goes to the Hub only: httpx drops it on a redirect to another origin.
    async with httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=True) as client:
        headers = [await _header(client, fetch) for _name, fetch in plan.parts]
    merged = msgspec.structs.replace(headers[0], tensors=[t for h in headers for t in h.tensors])
    return shape_from_header(merged), plan.source
