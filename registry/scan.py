"""Find models other tools already keep on disk (adopting them is `registry.reuse`).

Stores read (every root is a parameter; `default_roots()` reads the usual variables):

    ollama       <models>/manifests/<host>/<namespace>/<model>/<tag>  +  blobs/sha256-<hex>
    huggingface  <hub>/models--ORG--REPO/snapshots/<rev>/<file>  ->  ../../blobs/<etag>
    lmstudio     <models>/<publisher>/<repo>/<file>.gguf
    llama.cpp    <cache>/<org>_<repo>_<file>.gguf (+ a .json sidecar), or the hub layout

GGUF files count everywhere; in a Hugging Face snapshot so do a safetensors or MLX directory
(``config.json`` beside its shards) and a diffusion checkpoint (``.safetensors`` without a
``config.json``), told apart by ``registry.formats`` from their headers. Vision projectors
(mmproj) are companions, never models. A broken
entry (unreadable manifest, dangling symlink, a blob shorter than its manifest or its own
GGUF header says) is skipped with a warning:
scanning never raises for what it finds on disk. A sha256 is reported only when the store
names its files by it (Ollama blobs, Hugging Face LFS blobs); nothing is hashed by `scan`.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from ._names import canonical_name
from ._ollama import (
    ADAPTER_LAYER,
    MODEL_LAYER,
    PARAMS_LAYER,
    PROJECTOR_LAYER,
    SYSTEM_LAYER,
    TEMPLATE_LAYER,
    OllamaLayer,
    OllamaManifest,
    ollama_settings,
)
from .errors import InvalidModelFile, InvalidModelName, ModelFileIncomplete, RegistryError
from .formats import classify_tensors, detect, read_safetensors_header
from .gguf import check_complete, looks_like_gguf, read_model_info
from .store import ModelSettings

__all__ = [
    "Companion",
    "FoundModel",
    "Roots",
    "ScanResult",
    "StoreKind",
    "default_roots",
    "files_of_size",
    "scan",
]

StoreKind = Literal["ollama", "huggingface", "lmstudio", "llama.cpp"]

_HEX = re.compile(r"[0-9a-f]{64}")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# The quant tag inside a file name, as the Hub's GGUF repos spell it (last match wins).
_QUANT = re.compile(
    r"(?<![a-z0-9])(?:ud-)?(?:i?q\d(?:_[a-z0-9]+)*|bf16|f16|fp16|f32|mxfp4(?:_moe)?)(?![a-z0-9])",
    re.IGNORECASE,
)
_HUB_URL = re.compile(r"^https?://[^/]+/(?P<org>[^/]+)/(?P<repo>[^/]+)/resolve/[^/]+/(?P<file>.+)$")
_OLLAMA_HOST = "registry.ollama.ai"
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_SETTINGS_BYTES = 1 << 20
_STORE_ORDER: tuple[StoreKind, ...] = ("ollama", "huggingface", "lmstudio", "llama.cpp")


class Companion(msgspec.Struct, frozen=True, kw_only=True):
    """A file that belongs with a model: its vision projector, where the store pairs them."""

    path: str
    """The file itself, symlinks resolved."""
    filename: str
    """Its name in its store (a blob's name says nothing: ``mmproj-F16.gguf``)."""
    size: int
    sha256: str | None = None


class FoundModel(msgspec.Struct, frozen=True, kw_only=True):
    """One model in another tool's store: a GGUF file, or (Hugging Face cache) a safetensors
    or MLX snapshot directory or a diffusion checkpoint."""

    store: StoreKind
    root: str
    """The other store's root, e.g. ``/root/.ollama/models``."""
    name: str
    """The Blazar name suggested for it (canonical)."""
    origin: str
    """What the other tool calls it: ``llama3.2:1b``, ``org/repo/file.gguf``…"""
    path: str
    """The file itself, symlinks resolved; for a directory model, the snapshot folder."""
    size: int
    sha256: str | None = None
    """Known without hashing (the store names the file by it), else None."""
    format: str = "gguf"
    """``gguf``, ``safetensors``, ``mlx`` or ``diffusion`` (``registry.formats``)."""
    quantization: str | None = None
    family: str | None = None
    settings: ModelSettings | None = None
    companions: list[Companion] = []
    role: Literal["model", "projector"] = "model"

    @property
    def source(self) -> str:
        """What an adopted record's `source` says: ``<store>:<root>``."""
        return f"{self.store}:{self.root}"


class ScanResult(msgspec.Struct, frozen=True, kw_only=True):
    models: list[FoundModel]
    warnings: list[str]


class Roots(msgspec.Struct, frozen=True, kw_only=True):
    """Where each kind of store is looked for; a missing directory is simply empty."""

    ollama: tuple[str, ...] = ()
    huggingface: tuple[str, ...] = ()
    lmstudio: tuple[str, ...] = ()
    llamacpp: tuple[str, ...] = ()


# -- where stores live ------------------------------------------------------------


def default_roots(
    environ: Mapping[str, str] | None = None, home: Path | None = None, *, system_wide: bool | None = None
) -> Roots:
    """The stores' usual places, honouring OLLAMA_MODELS, HF_HUB_CACHE/HF_HOME and LLAMA_CACHE.

    `system_wide` adds Ollama's Linux service store (/usr/share/ollama); by default only when
    neither `environ` nor `home` is given, so tests never see the machine's own stores.
    """
    if system_wide is None:
        system_wide = environ is None and home is None
    env = os.environ if environ is None else environ
    home = Path(home) if home is not None else Path(env.get("HOME") or Path.home())
    xdg_cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"

    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else [home / ".ollama" / "models"]
    if system_wide:
        ollama.append(Path("/usr/share/ollama/.ollama/models"))

    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HUGGINGFACE_HUB_CACHE"):
        hub = Path(env["HUGGINGFACE_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hub = Path(env["HF_HOME"]) / "hub"
    else:
        hub = xdg_cache / "huggingface" / "hub"

    lmstudio = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]

    if env.get("LLAMA_CACHE"):
        llamacpp = [Path(env["LLAMA_CACHE"])]
    else:
        llamacpp = [xdg_cache / "llama.cpp"]
        if sys.platform == "darwin":
            llamacpp.append(home / "Library" / "Caches" / "llama.cpp")

    def strs(paths: Iterable[Path]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(p.expanduser().absolute()) for p in paths))

    return Roots(
        ollama=strs(ollama), huggingface=strs([hub]), lmstudio=strs(lmstudio), llamacpp=strs(llamacpp)
    )


# -- entries before naming ----------------------------------------------------------


@dataclass
class _Entry:
    store: StoreKind
    root: Path
    origin: str
    path: Path
    size: int
    base: str
    """The suggested name without its tag."""
    tag: str | None = None
    """The tag when the store gives one (Ollama); else derived from `filename`."""
    filename: str = ""
    sha256: str | None = None
    role: Literal["model", "projector"] = "model"
    settings: ModelSettings | None = None
    companions: list[Companion] = field(default_factory=list)
    format: str = "gguf"
    quantization: str | None = None
    family: str | None = None


@dataclass
class _Collector:
    entries: list[_Entry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def _segment(text: str) -> str:
    value = re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-")
    return value.lstrip(".") or "model"


def _tag(text: str) -> str:
    value = re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-.")
    return value if value and value[0] not in "-." else f"v{value}"


def _file_quant(filename: str) -> str | None:
    stem = Path(filename).name
    stem = m["stem"] if (m := _SPLIT.match(stem)) else re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    hits = _QUANT.findall(stem)
    return hits[-1] if hits else None


def _suggest(entry: _Entry, header_quant: str | None) -> str:
    base = "/".join(_segment(part) for part in entry.base.split("/") if part) or "model"
    tag = entry.tag or _file_quant(entry.filename) or header_quant or Path(entry.filename).stem or "default"
    try:
        return canonical_name(f"{base}:{_tag(tag)}")
    except InvalidModelName:
        return canonical_name(f"{_segment(base.replace('/', '-'))[:150]}:{_tag(tag)[:40]}")


def _walk_gguf(folder: Path, col: _Collector, max_depth: int) -> Iterator[Path]:
    """GGUF files (or symlinks to them) under `folder`, sorted, down to `max_depth` levels."""

    def on_error(exc: OSError) -> None:
        col.warn(f"cannot read {exc.filename}: {exc.strerror or exc}")

    base_depth = len(folder.parts)
    for dirpath, dirnames, filenames in os.walk(folder, onerror=on_error, followlinks=True):
        here = Path(dirpath)
        if len(here.parts) - base_depth >= max_depth:
            dirnames.clear()
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(".gguf") and not name.startswith("."):
                yield here / name


def _file_entry(link: Path, col: _Collector, label: str, **fields: Any) -> _Entry | None:
    """An entry for one GGUF file (its symlinks resolved), or None with a warning when it is unusable."""
    m = _SPLIT.match(link.name)
    if m is not None:
        if int(m["no"]) == 1:
            col.warn(f"{label}: {link.name} is split in {int(m['count'])} parts, which cannot be adopted yet")
        return None
    try:
        real = link.resolve(strict=True)
        if not real.is_file():
            col.warn(f"{label}: {link} is not a regular file — skipped")
            return None
        size = real.stat().st_size
    except (OSError, RuntimeError):
        col.warn(f"{label}: {link} is a dangling symlink — skipped")
        return None
    filename = fields.pop("filename", link.name)
    role: Literal["model", "projector"] = "projector" if "mmproj" in Path(filename).name.lower() else "model"
    entry = _Entry(path=real, size=size, filename=filename, role=role, **fields)
    col.entries.append(entry)
    return entry


def _pair_projectors(groups: Iterable[list[_Entry]]) -> None:
    """Each model gets the projectors of its group (a folder, a repo) as companions."""
    for group in groups:
        projectors = [
            Companion(path=str(e.path), filename=e.filename, size=e.size, sha256=e.sha256)
            for e in group
            if e.role == "projector"
        ]
        for entry in group:
            if entry.role == "model":
                entry.companions = list(projectors)


# -- Ollama ---------------------------------------------------------------------------


def _ollama_blob(root: Path, digest: str) -> tuple[str, Path] | None:
    hexpart = digest.lower().removeprefix("sha256:")
    if not digest.lower().startswith("sha256:") or not _HEX.fullmatch(hexpart):
        return None
    blobs = root / "blobs"
    # Ollama before 0.1.32 (and on some filesystems) spelled blobs `sha256:<hex>`.
    for candidate in (blobs / f"sha256-{hexpart}", blobs / f"sha256:{hexpart}"):
        if candidate.exists():
            return hexpart, candidate
    return hexpart, blobs / f"sha256-{hexpart}"


def _ollama_text(root: Path, layer: OllamaLayer, label: str, col: _Collector) -> str | None:
    found = _ollama_blob(root, layer.digest)
    if found is None or layer.size > _MAX_SETTINGS_BYTES:
        col.warn(
            f"{label}: ignored its {layer.media_type.rsplit('.', 1)[-1]} layer (bad digest or too large)"
        )
        return None
    try:
        return found[1].read_bytes()[:_MAX_SETTINGS_BYTES].decode("utf-8", errors="replace")
    except OSError as exc:
        col.warn(
            f"{label}: cannot read its {layer.media_type.rsplit('.', 1)[-1]} layer ({exc.strerror or exc})"
        )
        return None


def _ollama_settings(
    root: Path, layers: Sequence[OllamaLayer], label: str, col: _Collector
) -> ModelSettings | None:
    """The template, system and params layers as ModelSettings (the names are Ollama's options).

    An Ollama template is a Go template, which llama.cpp cannot run: it is kept only when it
    is Jinja, and otherwise the GGUF's own chat template is used.
    """
    texts = {
        layer.media_type: text
        for layer in layers
        if layer.media_type in (TEMPLATE_LAYER, SYSTEM_LAYER, PARAMS_LAYER)
        and (text := _ollama_text(root, layer, label, col)) is not None
    }
    params: dict[str, Any] = {}
    if PARAMS_LAYER in texts:
        try:
            params = msgspec.json.decode(texts[PARAMS_LAYER], type=dict[str, Any])
        except msgspec.DecodeError as exc:
            col.warn(f"{label}: its params layer is not a JSON object ({exc}) — parameters not carried over")
    return ollama_settings(texts.get(TEMPLATE_LAYER), texts.get(SYSTEM_LAYER), params)


def _scan_ollama(root: Path, col: _Collector) -> None:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for dirpath, _dirs, files in sorted(os.walk(manifests, onerror=lambda e: col.warn(f"ollama: {e}"))):
        for filename in sorted(files):
            path = Path(dirpath) / filename
            parts = path.relative_to(manifests).parts
            if filename.startswith(".") or len(parts) != 4:
                continue
            host, namespace, model, tag = parts
            base = model if namespace == "library" else f"{namespace}/{model}"
            if host != _OLLAMA_HOST:
                base = f"{host}/{base}"
            label = f"ollama {base}:{tag}"
            _ollama_manifest(root, path, base, tag, label, col)


def _ollama_manifest(root: Path, path: Path, base: str, tag: str, label: str, col: _Collector) -> None:
    try:
        raw = path.read_bytes()
        if len(raw) > _MAX_MANIFEST_BYTES:
            raise ValueError("manifest too large")
        manifest = msgspec.json.decode(raw, type=OllamaManifest)
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        col.warn(f"{label}: unreadable manifest {path} ({exc}) — skipped")
        return
    kinds = [layer.media_type for layer in manifest.layers]
    if ADAPTER_LAYER in kinds:
        col.warn(f"{label} needs a LoRA adapter, which Blazar cannot apply yet — skipped")
        return
    models = [layer for layer in manifest.layers if layer.media_type == MODEL_LAYER]
    if len(models) != 1:
        col.warn(f"{label}: the manifest has {len(models)} model layers, expected one — skipped")
        return
    weights = _ollama_weights(root, models[0], label, col)
    if weights is None:
        return
    sha, blob, size = weights
    companions: list[Companion] = []
    for layer in manifest.layers:
        if layer.media_type != PROJECTOR_LAYER:
            continue
        projector = _ollama_weights(root, layer, f"{label} (projector)", col)
        if projector is not None:
            p_sha, p_blob, p_size = projector
            companions.append(Companion(path=str(p_blob), filename="projector", size=p_size, sha256=p_sha))
            col.entries.append(
                _Entry(
                    store="ollama", root=root, origin=f"{base}:{tag} (projector)", path=p_blob, size=p_size,
                    base=base, tag=f"{tag}-mmproj", sha256=p_sha, role="projector",
                )
            )  # fmt: skip
    col.entries.append(
        _Entry(
            store="ollama", root=root, origin=f"{base}:{tag}", path=blob, size=size, base=base, tag=tag,
            sha256=sha, settings=_ollama_settings(root, manifest.layers, label, col), companions=companions,
        )
    )  # fmt: skip


def _ollama_weights(
    root: Path, layer: OllamaLayer, label: str, col: _Collector
) -> tuple[str, Path, int] | None:
    found = _ollama_blob(root, layer.digest)
    if found is None:
        col.warn(f"{label}: layer digest {layer.digest!r} is not a sha256 — skipped")
        return None
    sha, blob = found
    try:
        size = blob.stat().st_size
    except OSError:
        col.warn(f"{label}: blob {blob.name} is missing — skipped")
        return None
    if size != layer.size:
        col.warn(f"{label}: blob {blob.name} has {size} bytes, the manifest says {layer.size} — skipped")
        return None
    if not looks_like_gguf(blob):
        col.warn(f"{label}: blob {blob.name} is not a GGUF file — skipped")
        return None
    return sha, blob, size


# -- Hugging Face hub cache (also llama.cpp's newer cache) ---------------------------------


def _scan_hub(root: Path, col: _Collector, kind: StoreKind) -> None:
    if not root.is_dir():
        return
    for repo_dir in sorted(root.glob("models--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/")
        snapshots = repo_dir / "snapshots"
        if not snapshots.is_dir():
            continue
        main = ""
        with contextlib.suppress(OSError):
            main = (repo_dir / "refs" / "main").read_text().strip()
        # The revision `main` points at first, so its files win a name shared with older ones.
        for snapshot in sorted(
            (p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: (p.name != main, p.name)
        ):
            _scan_snapshot(root, snapshot, repo, col, kind)


def _scan_snapshot(root: Path, snapshot: Path, repo: str, col: _Collector, kind: StoreKind) -> None:
    group: list[_Entry] = []
    for link in _walk_gguf(snapshot, col, max_depth=4):
        origin = f"{repo}/{link.relative_to(snapshot).as_posix()}"
        entry = _file_entry(link, col, f"{kind} {repo}", store=kind, root=root, origin=origin, base=repo)
        if entry is not None:
            # An LFS file's blob is named by its sha256; a plain git file's by its sha1 (40 hex).
            if entry.path.parent.name == "blobs" and _HEX.fullmatch(entry.path.name):
                entry.sha256 = entry.path.name
            group.append(entry)
    _pair_projectors([group])
    _scan_weights(root, snapshot, repo, col, kind)


def _scan_weights(root: Path, snapshot: Path, repo: str, col: _Collector, kind: StoreKind) -> None:
    """A snapshot that is a safetensors or MLX directory, or holds diffusion checkpoints."""
    label = f"{kind} {repo}"
    try:
        top = sorted(p for p in snapshot.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        col.warn(f"{label}: cannot list {snapshot} ({exc.strerror or exc})")
        return
    names = {p.name for p in top}
    shards = [p for p in top if p.name.endswith(".safetensors")]
    if "config.json" in names and (shards or "weights.npz" in names):
        try:
            fmt = detect(snapshot)
        except (InvalidModelFile, OSError) as exc:
            col.warn(f"{label}: {exc.message if isinstance(exc, RegistryError) else exc} — skipped")
            return
        if fmt.format in ("safetensors", "mlx"):
            col.entries.append(
                _Entry(
                    store=kind, root=root, origin=repo, path=snapshot, size=fmt.size_bytes, base=repo,
                    format=fmt.format, quantization=fmt.quantization, family=fmt.architecture,
                )
            )  # fmt: skip
        return
    for link in shards:
        try:
            real = link.resolve(strict=True)
            arch = classify_tensors(read_safetensors_header(real).tensors)
        except (InvalidModelFile, OSError, RuntimeError):
            continue  # not readable, or not a checkpoint: another tool's business
        if arch is None:
            continue
        col.entries.append(
            _Entry(
                store=kind, root=root, origin=f"{repo}/{link.name}", path=real, size=real.stat().st_size,
                base=repo, filename=link.name, format="diffusion", family=arch,
                sha256=real.name if real.parent.name == "blobs" and _HEX.fullmatch(real.name) else None,
            )
        )  # fmt: skip


# -- LM Studio -------------------------------------------------------------------------------


def _scan_lmstudio(root: Path, col: _Collector) -> None:
    if not root.is_dir():
        return
    by_folder: dict[Path, list[_Entry]] = {}
    for link in _walk_gguf(root, col, max_depth=4):
        rel = link.relative_to(root)
        folders = rel.parent.parts
        base = "/".join(folders[:2]) if folders else f"lmstudio/{link.stem}"
        label = f"lmstudio {rel.parent.as_posix()}"
        entry = _file_entry(link, col, label, store="lmstudio", root=root, origin=rel.as_posix(), base=base)
        if entry is not None:
            by_folder.setdefault(link.parent, []).append(entry)
    _pair_projectors(by_folder.values())


# -- llama.cpp's cache -----------------------------------------------------------------------


class _Sidecar(msgspec.Struct, kw_only=True):
    url: str | None = None


def _flat_origin(path: Path) -> tuple[str, str] | None:
    """`(org/repo, file)` from the download URL llama.cpp kept in `<file>.json`, when there is one."""
    with contextlib.suppress(OSError, msgspec.DecodeError):
        sidecar = msgspec.json.decode(Path(f"{path}.json").read_bytes(), type=_Sidecar)
        if sidecar.url and (m := _HUB_URL.match(sidecar.url.split("?", 1)[0])):
            return f"{m['org']}/{m['repo']}", m["file"]
    return None


def _guess_flat(name: str) -> tuple[str, str]:
    """`(org/repo, file)` from `<org>_<repo>_<file>.gguf`: the repo is the piece ending in gguf, if any."""
    org, _, rest = name.partition("_")
    if not rest:
        return f"llama.cpp/{Path(name).stem}", name
    cuts = [i for i, ch in enumerate(rest) if ch == "_"]
    for i in cuts:
        if rest[:i].lower().endswith("gguf"):
            return f"{org}/{rest[:i]}", rest[i + 1 :]
    if cuts:
        return f"{org}/{rest[: cuts[0]]}", rest[cuts[0] + 1 :]
    return f"{org}/{Path(rest).stem}", rest


def _scan_llamacpp(root: Path, col: _Collector) -> None:
    if not root.is_dir():
        return
    by_repo: dict[str, list[_Entry]] = {}
    try:
        files = sorted(
            p for p in root.iterdir() if p.name.lower().endswith(".gguf") and not p.name.startswith(".")
        )
    except OSError as exc:
        col.warn(f"llama.cpp: cannot list {root} ({exc.strerror or exc})")
        files = []
    for link in files:
        repo, filename = _flat_origin(link) or _guess_flat(link.name)
        entry = _file_entry(
            link, col, f"llama.cpp {link.name}", store="llama.cpp", root=root, origin=link.name, base=repo,
            filename=filename,
        )  # fmt: skip
        if entry is not None:
            by_repo.setdefault(repo.lower(), []).append(entry)
    _pair_projectors(by_repo.values())
    _scan_hub(root, col, "llama.cpp")


# -- scanning ----------------------------------------------------------------------------------


def _collect(roots: Roots) -> _Collector:
    col = _Collector()
    plan: list[tuple[str, tuple[str, ...], Callable[[Path, _Collector], None]]] = [
        ("ollama", roots.ollama, _scan_ollama),
        ("huggingface", roots.huggingface, lambda root, col: _scan_hub(root, col, "huggingface")),
        ("lmstudio", roots.lmstudio, _scan_lmstudio),
        ("llama.cpp", roots.llamacpp, _scan_llamacpp),
    ]
    for kind, paths, read in plan:
        for raw in dict.fromkeys(paths):
            root = Path(raw).expanduser().absolute()
            try:
                read(root, col)
            except (OSError, ValueError, RuntimeError) as exc:
                # A store that breaks mid-walk hides only itself, never the other stores.
                col.warn(f"{kind}: stopped reading {root} ({exc})")
    return col


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _found(
    entry: _Entry, name: str, quantization: str | None = None, family: str | None = None
) -> FoundModel:
    return FoundModel(
        store=entry.store,
        root=str(entry.root),
        name=name,
        origin=entry.origin,
        path=str(entry.path),
        size=entry.size,
        sha256=entry.sha256,
        format=entry.format,
        quantization=quantization,
        family=family,
        settings=entry.settings,
        companions=list(entry.companions),
        role=entry.role,
    )


def scan(roots: Roots | None = None) -> ScanResult:
    """Every model in the stores under `roots` (default: `default_roots()`), one per name: GGUF
    files, and in Hugging Face caches safetensors/MLX snapshots and diffusion checkpoints."""
    col = _collect(roots if roots is not None else default_roots())
    models: list[FoundModel] = []
    seen: set[tuple[tuple[int, int] | None, str]] = set()
    names: dict[str, tuple[int, int] | None] = {}
    for entry in col.entries:
        if entry.role != "model":
            continue
        if entry.format != "gguf":  # read already, from its headers
            name = canonical_name(_segment_path(entry.base)) if entry.path.is_dir() else _suggest(entry, None)
            models.append(_found(entry, _unique_in(name, entry, names), entry.quantization, entry.family))
            continue
        try:
            info = read_model_info(entry.path)
        except (RegistryError, OSError, ValueError) as exc:
            if _diffusion_gguf(entry):  # sd.cpp's own conversions name no architecture
                models.append(
                    _found(entry, _unique_in(_suggest(entry, None), entry, names), None, entry.family)
                )
                continue
            message = exc.message if isinstance(exc, RegistryError) else str(exc)
            col.warn(f"{entry.store} {entry.origin}: not a readable GGUF file ({message}) — skipped")
            continue
        try:
            # A download the other tool never finished: llama.cpp would refuse it at load.
            check_complete(
                info, entry.size, f"{entry.store} {entry.origin}", advice="skipped; re-download it"
            )
        except ModelFileIncomplete as exc:
            col.warn(exc.message)
            continue
        name = _suggest(entry, info.file_type)
        inode = _inode(entry.path)
        # The same file reached twice (overlapping roots, LLAMA_CACHE pointing at the hub) counts once.
        if (inode, name) in seen:
            continue
        seen.add((inode, name))
        if name in names and names[name] != inode:
            name = _unique(name, entry.store, names)
        names[name] = inode
        quant = info.file_type or _file_quant(entry.filename)
        if classify_tensors(t.name for t in info.tensors) is not None:
            entry.format = "diffusion"  # an image model in GGUF form: adopted as one
        models.append(_found(entry, name, quant, info.architecture))
    models.sort(key=lambda m: (_STORE_ORDER.index(m.store), m.name))
    return ScanResult(models=models, warnings=col.warnings)


def _diffusion_gguf(entry: _Entry) -> bool:
    """A GGUF without a text model's metadata that holds an image model's tensors."""
    try:
        found = detect(entry.path)
    except (RegistryError, OSError, ValueError):
        return False
    if found.format != "diffusion":
        return False
    entry.format, entry.family = "diffusion", found.architecture
    return True


def _unique_in(name: str, entry: _Entry, names: dict[str, tuple[int, int] | None]) -> str:
    """``name``, or a variant of it when another file has it already; then taken."""
    if name in names:
        name = _unique(name, entry.store, names)
    names[name] = _inode(entry.path)
    return name


def _segment_path(base: str) -> str:
    return "/".join(_segment(part) for part in base.split("/") if part) or "model"


def _unique(name: str, kind: StoreKind, taken: Mapping[str, object]) -> str:
    stem = f"{name}-{_tag(kind)}" if ":" in name else f"{name}:{_tag(kind)}"
    candidate, n = stem, 2
    while candidate in taken:
        candidate, n = f"{stem}-{n}", n + 1
    return canonical_name(candidate)


def files_of_size(size: int, roots: Roots | None = None, *, filename: str | None = None) -> list[FoundModel]:
    """Every GGUF file of exactly `size` bytes under `roots`, models and projectors alike.

    Nothing is read or hashed: names are suggested from the stores' own naming only, and
    `sha256` is set where the store names the file by it. With `filename`, only files of
    that name (case-insensitive; a store without file names is matched by its origin).
    """
    col = _collect(roots if roots is not None else default_roots())
    wanted = Path(filename).name.lower() if filename is not None else None
    return [
        _found(entry, _suggest(entry, None))
        for entry in col.entries
        if entry.size == size
        and not entry.path.is_dir()
        and (wanted is None or (entry.filename or Path(entry.origin).name).lower() == wanted)
    ]
