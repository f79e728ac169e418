"""`blazar search`: the catalog first, then GGUF repositories on the Hugging Face Hub.

The hub part lists repositories tagged ``gguf`` that match the query (most
downloaded first) and, for each, its GGUF files with quant and size, so the user
can pick ``hf.co/ORG/REPO:QUANT`` before downloading anything. Offline (or with
``HF_HUB_OFFLINE``), the catalog answers alone and the result says why.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import msgspec
import trio

from ._hf import SourceFailed, hf_endpoint, hf_offline
from .catalog import Catalog, CatalogEntry

__all__ = ["CatalogHit", "HubFile", "HubRepo", "SearchResult", "quant_of", "search", "search_catalog"]

_QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_K)?(?:_[A-Z0-9]{1,2})?|BF16|F16|F32)(?![A-Za-z0-9])", re.I)
_SPLIT_TAIL = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_TIMEOUT_S = 15.0
_CONNECT_TIMEOUT_S = 5.0


class CatalogHit(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    family: str | None
    parameter_size: str | None
    quantization: str | None
    size: int | None
    capabilities: list[str]


class HubFile(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    quant: str | None
    size: int | None
    """Bytes of the whole model: all parts of a split file added up."""


class HubRepo(msgspec.Struct, frozen=True, kw_only=True):
    repo: str
    downloads: int
    likes: int
    files: list[HubFile]


class SearchResult(msgspec.Struct, frozen=True, kw_only=True):
    query: str
    catalog: list[CatalogHit]
    hub: list[HubRepo]
    note: str | None = None


def quant_of(filename: str) -> str | None:
    """The quant tag in a GGUF file name (``Q4_K_M``, ``IQ3_XS``, ``F16``…), upper-cased."""
    stem = _SPLIT_TAIL.sub("", filename.rsplit("/", 1)[-1])
    found = _QUANT.findall(stem.removesuffix(".gguf"))
    return found[-1].upper() if found else None


def _words(entry: CatalogEntry) -> str:
    return " ".join(
        filter(
            None,
            [
                entry.name,
                entry.description,
                entry.family,
                entry.parameter_size,
                entry.kind,
                *entry.capabilities,
            ],
        )
    ).lower()


def search_catalog(catalog: Catalog, query: str) -> list[CatalogHit]:
    """Catalog entries holding every word of the query (name matches first)."""
    terms = query.lower().split()
    hits = [e for e in catalog.entries() if all(t in _words(e) for t in terms)]
    hits.sort(key=lambda e: (not all(t in e.name for t in terms), e.name))
    return [
        CatalogHit(
            name=e.name,
            description=e.description,
            family=e.family,
            parameter_size=e.parameter_size,
            quantization=e.quantization,
            size=e.total_size(),
            capabilities=list(e.capabilities),
        )
        for e in hits
    ]


def _gguf_files(siblings: list[dict[str, Any]]) -> list[HubFile]:
    """One entry per model in a repo: split parts summed, projector files left out."""
    sizes: dict[str, int | None] = {}
    for sibling in siblings:
        name = str(sibling.get("rfilename", ""))
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        split = _SPLIT_TAIL.search(name)
        key = _SPLIT_TAIL.sub(f"-00001-of-{split.group(2)}.gguf", name) if split else name
        size = sibling.get("size")
        previous = sizes.get(key, 0)
        sizes[key] = None if not isinstance(size, int) or previous is None else previous + size
    return [HubFile(file=f, quant=quant_of(f), size=s) for f, s in sorted(sizes.items())]


async def _search_hub(query: str, limit: int) -> list[HubRepo]:
    """The hub's REST API straight through httpx: fails in seconds when offline, where
    huggingface_hub's own client keeps retrying a failed DNS lookup."""
    from huggingface_hub.utils import build_hf_headers

    if hf_offline():
        raise SourceFailed("HF_HUB_OFFLINE is set, so the Hugging Face Hub is not contacted")
    timeout = httpx.Timeout(_TIMEOUT_S, connect=_CONNECT_TIMEOUT_S)
    async with httpx.AsyncClient(
        base_url=hf_endpoint(), headers=build_hf_headers(), timeout=timeout
    ) as client:
        params = {
            "search": query,
            "filter": "gguf",
            "sort": "downloads",
            "direction": "-1",
            "limit": str(limit),
        }
        listing = await client.get("/api/models", params=params)
        listing.raise_for_status()
        found: list[dict[str, Any]] = listing.json()
        repos: list[HubRepo | None] = [None] * len(found)

        async def detail(i: int, model: dict[str, Any]) -> None:
            resp = await client.get(f"/api/models/{model['id']}", params={"blobs": "true"})
            if resp.status_code != 200:
                return  # gone or gated since the listing: leave it out
            repos[i] = HubRepo(
                repo=model["id"],
                downloads=int(model.get("downloads") or 0),
                likes=int(model.get("likes") or 0),
                files=_gguf_files(resp.json().get("siblings") or []),
            )

        async with trio.open_nursery() as nursery:
            for i, model in enumerate(found):
                nursery.start_soon(detail, i, model)
    return [r for r in repos if r is not None and r.files]


async def search(query: str, catalog: Catalog, *, limit: int = 10, hub: bool = True) -> SearchResult:
    hits = search_catalog(catalog, query)
    if not hub:
        return SearchResult(query=query, catalog=hits, hub=[], note="catalog only (--offline)")
    try:
        repos = await _search_hub(query, limit)
    except SourceFailed as exc:
        return SearchResult(query=query, catalog=hits, hub=[], note=f"catalog only: {exc}")
    except (httpx.HTTPError, ValueError) as exc:  # offline, DNS, hub error: the catalog still answers
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return SearchResult(
            query=query,
            catalog=hits,
            hub=[],
            note=f"catalog only: the Hugging Face Hub could not be searched ({reason})",
        )
    return SearchResult(query=query, catalog=hits, hub=repos)
