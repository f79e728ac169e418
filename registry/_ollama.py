"""The Ollama registry: `ollama:[NS/]NAME[:TAG]` resolved through its manifest and blob API.

The manifest (Docker distribution v2) lists layers by media type: the GGUF weights, an
optional vision projector, and small template / system / params layers, which become
the model's settings. Every layer is checked against its sha256 digest.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec

from ._download import Fetch, Plan, RetryPolicy, fetch_small
from ._names import canonical_name
from .errors import InvalidModelName, ModelNotFound, PullFailed
from .store import ModelSettings

__all__ = [
    "ADAPTER_LAYER",
    "MODEL_LAYER",
    "PARAMS_LAYER",
    "PROJECTOR_LAYER",
    "SYSTEM_LAYER",
    "TEMPLATE_LAYER",
    "OllamaLayer",
    "OllamaManifest",
    "OllamaRef",
    "local_blob",
    "ollama_settings",
    "parse_ollama_ref",
    "resolve_local",
    "resolve_ollama",
]

DEFAULT_REGISTRY = "https://registry.ollama.ai"
_DEFAULT_HOST = "registry.ollama.ai"
_MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
)
MODEL_LAYER = "application/vnd.ollama.image.model"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
ADAPTER_LAYER = "application/vnd.ollama.image.adapter"
TEMPLATE_LAYER = "application/vnd.ollama.image.template"
SYSTEM_LAYER = "application/vnd.ollama.image.system"
PARAMS_LAYER = "application/vnd.ollama.image.params"
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SETTINGS_LAYER_BYTES = 1 << 20
_HEX = re.compile(r"[0-9a-f]{64}")
# Ollama's templates are Go templates: they name fields with a dot or use Go's keywords. Jinja never does.
_GO_TEMPLATE = re.compile(r"\{\{-?\s*(?:\.|end\b|range\b|if\b|else\b|with\b|template\b|define\b|block\b)")


class OllamaRef(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    tag: str
    canonical: str
    """The local model name: `name:tag`, or `ns/name:tag` outside the library namespace."""

    def describe(self) -> str:
        return f"ollama:{self.namespace}/{self.name}:{self.tag}"


class OllamaLayer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    media_type: str
    digest: str
    size: int


class OllamaManifest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    schema_version: int = 2
    layers: list[OllamaLayer] = []


def registry_base() -> str:
    return (os.environ.get("BLAZAR_OLLAMA_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


def parse_ollama_ref(raw: str) -> OllamaRef:
    """`ollama:[ns/]name[:tag]` → its parts; InvalidModelName for anything else."""
    body = raw.strip()
    if not body.lower().startswith("ollama:"):
        raise InvalidModelName(f"'{raw}' is not an Ollama registry name (ollama:name[:tag])")
    base, _, tag = body[len("ollama:") :].strip().lower().partition(":")
    namespace, _, name = base.rpartition("/")
    namespace = namespace or "library"
    tag = tag or "latest"
    if not name or "/" in namespace:
        raise InvalidModelName(
            f"'{raw}' is not an Ollama registry name — use ollama:name[:tag] or ollama:ns/name[:tag]"
        )
    local = f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"
    return OllamaRef(namespace=namespace, name=name, tag=tag, canonical=canonical_name(local))


def ollama_settings(
    template: str | None, system: str | None, params: dict[str, Any] | None
) -> ModelSettings | None:
    """Settings from a registry model's template, system and params layers (as /api/create maps them).

    An Ollama template is a Go template, which llama.cpp cannot run: it is kept only when it
    is in fact Jinja; otherwise the GGUF's own chat template serves.
    """
    jinja = template if template and _GO_TEMPLATE.search(template) is None else None
    settings = ModelSettings(system=system or None, template=jinja, parameters=dict(params or {}))
    return None if settings == ModelSettings() else settings


def _layer_hex(layer: OllamaLayer, label: str) -> str:
    hexpart = layer.digest.lower().removeprefix("sha256:")
    if not layer.digest.lower().startswith("sha256:") or not _HEX.fullmatch(hexpart):
        raise PullFailed(f"{label}: the manifest lists a layer with digest {layer.digest!r}, not a sha256")
    if layer.size < 0:
        raise PullFailed(f"{label}: the manifest lists a layer of negative size")
    return hexpart


async def _settings(
    client: httpx.AsyncClient, blob_url: str, layers: Sequence[OllamaLayer], label: str, retry: RetryPolicy
) -> ModelSettings | None:
    texts: dict[str, str] = {}
    for layer in layers:
        if layer.media_type not in (TEMPLATE_LAYER, SYSTEM_LAYER, PARAMS_LAYER) or layer.media_type in texts:
            continue
        digest = _layer_hex(layer, label)
        kind = layer.media_type.rsplit(".", 1)[-1]
        if layer.size > _MAX_SETTINGS_LAYER_BYTES:
            raise PullFailed(f"{label}: the {kind} layer is {layer.size} bytes, too large to be settings")
        resp = await fetch_small(
            client,
            blob_url + layer.digest,
            label=f"{label} ({kind})",
            max_bytes=_MAX_SETTINGS_LAYER_BYTES,
            sha256=digest,
            retry=retry,
        )
        if resp.status_code != 200:
            raise PullFailed(f"{label}: HTTP {resp.status_code} for the {kind} layer")
        texts[layer.media_type] = resp.content.decode("utf-8", errors="replace")
    params: dict[str, Any] | None = None
    if PARAMS_LAYER in texts:
        try:
            params = msgspec.json.decode(texts[PARAMS_LAYER], type=dict[str, Any])
        except msgspec.DecodeError as exc:
            raise PullFailed(f"{label}: the params layer is not a JSON object ({exc})") from exc
    return ollama_settings(texts.get(TEMPLATE_LAYER), texts.get(SYSTEM_LAYER), params)


async def resolve_ollama(client: httpx.AsyncClient, ref: OllamaRef, retry: RetryPolicy) -> Plan:
    """Read the manifest of `ref` (and its settings layers); the weights are left to download."""
    base = registry_base()
    label = ref.describe()
    resp = await fetch_small(
        client,
        f"{_repo_url(ref)}/manifests/{ref.tag}",
        label=label,
        max_bytes=_MAX_MANIFEST_BYTES,
        headers={"Accept": _MANIFEST_TYPES},
        retry=retry,
    )
    if resp.status_code == 404:
        raise ModelNotFound(
            ref.canonical,
            f"'{ref.name}:{ref.tag}' is not in the Ollama registry at {base} — check the name and tag",
        )
    if resp.status_code in (401, 403):
        raise PullFailed(f"{label}: the registry at {base} refused access (HTTP {resp.status_code})")
    if resp.status_code != 200:
        raise PullFailed(f"{label}: HTTP {resp.status_code} from the registry at {base}")
    try:
        manifest = msgspec.json.decode(resp.content, type=OllamaManifest)
    except msgspec.DecodeError as exc:
        raise PullFailed(f"{label}: the registry sent an unreadable manifest ({exc})") from exc
    _check_layers(manifest, label)
    settings = await _settings(client, f"{_repo_url(ref)}/blobs/", manifest.layers, label, retry)
    return _plan(ref, manifest, settings)


def _repo_url(ref: OllamaRef) -> str:
    return f"{registry_base()}/v2/{ref.namespace}/{ref.name}"


def _check_layers(manifest: OllamaManifest, label: str) -> None:
    if any(layer.media_type == ADAPTER_LAYER for layer in manifest.layers):
        raise PullFailed(f"{label} needs a LoRA adapter layer, which Blazar cannot apply yet")
    models = [layer for layer in manifest.layers if layer.media_type == MODEL_LAYER]
    if len(models) != 1:
        raise PullFailed(f"{label}: the manifest has {len(models)} model layers, expected one")


def _plan(ref: OllamaRef, manifest: OllamaManifest, settings: ModelSettings | None) -> Plan:
    label = ref.describe()
    model = next(layer for layer in manifest.layers if layer.media_type == MODEL_LAYER)
    projector = next((layer for layer in manifest.layers if layer.media_type == PROJECTOR_LAYER), None)

    def fetch(layer: OllamaLayer) -> Fetch:
        # The registry redirects blob reads to its CDN, whose host varies: any https host is allowed.
        return Fetch(
            url=f"{_repo_url(ref)}/blobs/{layer.digest}",
            sha256=_layer_hex(layer, label),
            size=layer.size,
            label=label,
        )

    return Plan(
        source=label,
        parts=[(f"{ref.name}.gguf", fetch(model))],
        projector=fetch(projector) if projector else None,
        settings=settings,
    )


# -- Ollama's own store on this machine -------------------------------------------------


class _LocalGap(Exception):
    """A layer the local store lacks, or holds with other bytes than its digest."""


def local_blob(root: Path, digest: str) -> Path | None:
    """The blob of `digest` in the Ollama store at `root`, when it is there."""
    hexpart = digest.lower().removeprefix("sha256:")
    if not digest.lower().startswith("sha256:") or not _HEX.fullmatch(hexpart):
        return None
    # Ollama before 0.1.32 (and on some filesystems) spelled blobs `sha256:<hex>`.
    for candidate in (root / "blobs" / f"sha256-{hexpart}", root / "blobs" / f"sha256:{hexpart}"):
        if candidate.is_file():
            return candidate
    return None


def _local_settings(root: Path, layers: Sequence[OllamaLayer]) -> ModelSettings | None:
    """The settings layers read from the local store, each checked against its digest;
    _LocalGap when one is missing or damaged there."""
    texts: dict[str, str] = {}
    for layer in layers:
        if layer.media_type not in (TEMPLATE_LAYER, SYSTEM_LAYER, PARAMS_LAYER) or layer.media_type in texts:
            continue
        blob = local_blob(root, layer.digest)
        if blob is None or layer.size > _MAX_SETTINGS_LAYER_BYTES:
            raise _LocalGap(layer.digest)
        data = blob.read_bytes()
        if hashlib.sha256(data).hexdigest() != layer.digest.lower().removeprefix("sha256:"):
            raise _LocalGap(layer.digest)
        texts[layer.media_type] = data.decode("utf-8", errors="replace")
    params = msgspec.json.decode(texts[PARAMS_LAYER], type=dict[str, Any]) if PARAMS_LAYER in texts else None
    return ollama_settings(texts.get(TEMPLATE_LAYER), system=texts.get(SYSTEM_LAYER), params=params)


def resolve_local(ref: OllamaRef, roots: Sequence[str | os.PathLike[str]]) -> tuple[Plan, Path] | None:
    """Runs in a thread: `ref` read from an Ollama store on this machine (the first of `roots`
    whose manifest and blobs are whole), without contacting the registry. Returns the plan and
    the store's root, or None when no store holds all of it.

    Ollama keeps models of its default registry under `registry.ollama.ai`, whichever
    registry Blazar is pointed at: a mirror serves the same names.
    """
    for raw in roots:
        root = Path(raw)
        path = root / "manifests" / _DEFAULT_HOST / ref.namespace / ref.name / ref.tag
        try:
            raw_manifest = path.read_bytes()
            if len(raw_manifest) > _MAX_MANIFEST_BYTES:
                continue
            manifest = msgspec.json.decode(raw_manifest, type=OllamaManifest)
            _check_layers(manifest, ref.describe())
            weights = [
                layer for layer in manifest.layers if layer.media_type in (MODEL_LAYER, PROJECTOR_LAYER)
            ]
            blobs = [local_blob(root, layer.digest) for layer in weights]
            if any(
                b is None or b.stat().st_size != layer.size for b, layer in zip(blobs, weights, strict=True)
            ):
                continue
            settings = _local_settings(root, manifest.layers)
        except (OSError, _LocalGap, msgspec.DecodeError, PullFailed):
            # A damaged local entry is no answer: the registry is asked instead.
            continue
        return _plan(ref, manifest, settings), root
    return None
