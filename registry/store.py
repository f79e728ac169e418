"""Content-addressed model store: sha256 blobs, one JSON manifest per name, atomic writes.

Layout under the root (`<home>/models`):

    blobs/sha256-<hex>        model bytes (a hardlink, a copy, or a symlink for link=True)
    manifests/<name>.json     one ModelRecord per model name
    info/sha256-<hex>.json    cached GGUF header facts
    info/template-v<n>-<hex>.json  cached chat template facts, by the template's sha256
    shards/sha256-<hex>/      a split GGUF's parts under their original names (links to blobs)
    trees/sha256-<hex>/       a multi-file model (whisper, piper, a safetensors or MLX directory, a
                              diffusion checkpoint) laid out as its engine opens it:
                              each file under its own name, a relative symlink to its blob
    partial/                  downloads in progress (resumable, never listed), with a .lock each
    reuse-hashes.json         hashes of files in other tools' stores (registry/reuse.py)

Every method is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ._names import canonical_name
from .errors import (
    ChecksumMismatch,
    DiskFull,
    InvalidModelFile,
    ModelNotFound,
    RegistryError,
    is_disk_full,
)
from .files import atomic_replace, atomic_write, atomic_writer, fsync_dir, shown_folder

if TYPE_CHECKING:
    from .gguf import ModelInfo
    from .template import TemplateFacts

__all__ = [
    "KINDS",
    "Adapter",
    "ControlVector",
    "ModelFile",
    "ModelRecord",
    "ModelSettings",
    "SpeechFacts",
    "Store",
    "WeightFacts",
    "canonical_name",
    "sha256_file",
    "tree_id",
]

KINDS = ("chat", "embedding", "rerank", "stt", "tts", "image")
"""What a model does, as its manifest records it (``ModelRecord.kind``)."""
TREE_MARKER = ".blazar-model.json"
"""In a materialized tree: the kind, format and files it was built for (see ``Store.materialize``)."""

_CHUNK_BYTES = 1 << 20
_FILE_MODE = 0o600
"""Manifests, header caches and copied blobs are written readable by their owner alone."""
_HEX = re.compile(r"[0-9a-f]{64}")
# errnos meaning "this filesystem pair cannot hardlink", where a copy is the answer.
_NO_HARDLINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a Modelfile (Ollama ``create``, or a registry pull) adds to the weights."""

    system: str | None = None
    """Default system prompt, used when a request brings none."""
    template: str | None = None
    """Chat template (Jinja) that replaces the one in the GGUF."""
    parameters: dict[str, Any] = {}
    """Default sampling options (Ollama option names: temperature, num_predict, stop…)."""


class ModelFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a multi-file model: its name relative to the model's folder, its blob."""

    name: str
    """``model.bin``, ``en_US-joe-medium.onnx.json``; ``/`` separates folders."""
    digest: str
    """``sha256:<hex>``; the bytes are the blob ``blobs/sha256-<hex>``."""
    size: int


class SpeechFacts(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a speech model's own files (or its catalog entry) say about it."""

    architecture: str
    """``whisper`` (stt) or ``piper`` (tts)."""
    language: str | None = None
    """``en``, ``en_US``; ``multilingual`` for a whisper model that detects the language."""
    sample_rate: int | None = None
    """Hz of the audio the model takes (stt: 16000) or makes (tts: the voice's rate)."""
    quality: str | None = None
    """A piper voice's quality tier: ``x_low``, ``low``, ``medium``, ``high``."""
    speakers: int | None = None
    """How many voices a piper model has (1 for most)."""


class WeightFacts(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the weights' own headers say about a model that is not one GGUF file: a
    safetensors or MLX directory, a diffusion checkpoint, a whisper.cpp ggml file
    (``registry.formats``; nothing is loaded to learn it)."""

    architecture: str | None = None
    """``LlamaForCausalLM`` (config.json), ``sdxl``/``flux``… (diffusion), ``whisper``."""
    quantization: str | None = None
    """``awq``, ``gptq``, ``fp8``… (config.json), ``4bit`` (MLX), ``q5_1`` (ggml); None: plain."""
    parameters: int | None = None
    """Counted from the tensors' shapes (packed 4-bit tensors unpacked)."""
    dtype: str | None = None
    """The most common tensor dtype (``BF16``, ``F16``…)."""
    container: str | None = None
    """A diffusion checkpoint's own file format: ``safetensors``, ``ckpt``, ``gguf``."""
    context_length: int | None = None
    """Training context (config.json ``max_position_embeddings``)."""
    kv_bytes_per_token: int | None = None
    """KV cache bytes per token in a 16-bit cache, from config.json (the fit plan's KV term)."""
    weights_bytes: int | None = None
    """Bytes of the weight files alone (shards, checkpoint), without tokenizer and configs."""
    hparams: dict[str, int] = {}
    """Shape numbers the header gives: config.json's ``num_hidden_layers``, ``hidden_size``…;
    a ggml whisper file's ``n_vocab``, ``n_audio_layer``…"""


class Adapter(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter of a model (``blazar lora add``): a GGUF blob the engine loads beside
    the weights (``registry.adapters``)."""

    name: str
    digest: str
    """``sha256:<hex>``; the bytes are the blob ``blobs/sha256-<hex>`` (``Store.blob_path``)."""
    size: int
    scale: float = 1.0
    """The scale the engine starts it with; a request may choose another (0: off)."""
    alpha: float | None = None
    """The adapter's ``adapter.lora.alpha`` (llama.cpp scales by alpha / rank)."""
    rank: int | None = None
    added_at: float = 0.0


class ControlVector(msgspec.Struct, frozen=True, kw_only=True):
    """A control (steering) vector of a model (``blazar control add``): a GGUF blob of one
    direction per layer that a request may add to the model's hidden state
    (``registry.control``)."""

    name: str
    digest: str
    """``sha256:<hex>``; the bytes are the blob ``blobs/sha256-<hex>``."""
    size: int
    layers: list[int]
    """The layers it has a direction for (llama.cpp's ``direction.N``: 1 and up)."""
    width: int
    """Floats per direction: the model's embedding width."""
    model_hint: str | None = None
    """The file's ``controlvector.model_hint``: the architecture it was made from."""
    added_at: float = 0.0


class ModelRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One installed model: the manifest ``manifests/<name>.json``.

    A GGUF model is one blob (``digest``, plus split parts and a projector in ``blobs``)
    and ``files`` is empty: the shape every manifest had before multi-file models, read
    unchanged. A multi-file model (``stt`` whisper in CTranslate2 form or a whisper.cpp
    file, ``tts`` piper, a safetensors or MLX directory, an ``image`` model's diffusion
    checkpoint) lists every file in ``files``; ``digest`` is its main file's (``model.bin``,
    the ``.onnx``, ``config.json``, the checkpoint), ``blobs`` the others', and ``path`` what
    its engine opens, inside the tree ``Store.materialize`` lays out."""

    name: str
    digest: str
    size: int
    """Bytes of every file together."""
    path: str
    format: str = "gguf"
    """``gguf``; ``ctranslate2`` (a faster-whisper model folder), ``onnx`` (a piper voice),
    ``ggml-whisper`` (a whisper.cpp file), ``safetensors`` (a Hugging Face directory), ``mlx``
    (an MLX directory) or ``diffusion`` (an image model's checkpoint)."""
    kind: str = "chat"
    """One of ``KINDS``: manifests written before kinds existed are GGUF chat models."""
    source: str
    created_at: float
    modified_at: float
    settings: ModelSettings | None = None
    projector: str | None = None
    """Path of the vision projector (mmproj) blob, when the model has one."""
    blobs: list[str] = []
    """The other blobs the model needs (``sha256:`` digests): split parts 2..N, the projector,
    a multi-file model's other files."""
    files: list[ModelFile] = []
    """A multi-file model's files; empty for a GGUF model."""
    entry: str = ""
    """Which of ``files`` an engine opens (piper: the ``.onnx``); ``""``: the folder itself
    (faster-whisper)."""
    speech: SpeechFacts | None = None
    facts: WeightFacts | None = None
    """A safetensors/MLX directory's, a diffusion checkpoint's or a ggml file's header facts."""
    adapters: list[Adapter] = []
    """LoRA adapters loaded with the model, in the order the engine numbers them (0, 1, …)."""
    control_vectors: list[ControlVector] = []
    """Control vectors a request may steer the model with (``POST /v1/chat/completions/control``)."""

    def digests(self) -> list[str]:
        """Every blob this model uses, its main file first (its adapters' and control vectors' last)."""
        return [
            self.digest,
            *self.blobs,
            *(a.digest for a in self.adapters),
            *(c.digest for c in self.control_vectors),
        ]


def tree_id(record: ModelRecord) -> str:
    """The folder name of a multi-file model's tree: a digest of its kind and files, so
    two names of the same files share one tree and a changed file set gets a new one."""
    lines = [record.kind, record.format, record.entry]
    lines += sorted(f"{f.name}\0{f.digest}" for f in record.files)
    return "sha256-" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def check_file_name(name: str) -> str:
    """A multi-file model's relative file name, refused when it could leave its tree."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise InvalidModelFile(f"{name!r} is not a usable file name inside a model folder")
    return name


def sha256_file(path: str | os.PathLike[str], on_progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file; `on_progress` receives the running count of bytes hashed."""
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if on_progress is not None:
                on_progress(done)
    return digest.hexdigest()


def _check_hex(sha256_hex: str) -> str:
    value = sha256_hex.lower().removeprefix("sha256:")
    if not _HEX.fullmatch(value):
        raise RegistryError(f"'{sha256_hex}' is not a sha256 hex digest")
    return value


def _storage_error(
    exc: OSError, what: str, *, noun: str, folder: Path, root: Path, needed: int | None = None
) -> RegistryError:
    """``DiskFull`` (naming ``noun``, ``folder`` from the data dir and ``needed`` bytes) for a
    full disk; else what failed (``what``) and why."""
    if is_disk_full(exc):
        return DiskFull(noun, where=shown_folder(folder, root.parent), needed_bytes=needed)
    return RegistryError(f"cannot {what}: {exc.strerror or exc}")


def _size(path: Path | str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    atomic_write(path, data, mode=_FILE_MODE)


def _atomic_copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as inp, atomic_writer(dst, mode=_FILE_MODE) as out:
        shutil.copyfileobj(inp, out, _CHUNK_BYTES)


class Store:
    """The model store rooted at `root`; directories are created on first write."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.info_dir = self.root / "info"
        self.partial_dir = self.root / "partial"
        self.shards_dir = self.root / "shards"
        self.trees_dir = self.root / "trees"

    def __repr__(self) -> str:
        return f"<Store {self.root}>"

    def blob_path(self, sha256_hex: str) -> Path:
        return self.blobs_dir / f"sha256-{_check_hex(sha256_hex)}"

    def has_blob(self, sha256_hex: str) -> bool:
        # exists() follows symlinks, so a linked blob whose target vanished counts as absent.
        return self.blob_path(sha256_hex).exists()

    def partial_path(self, sha256_hex: str) -> Path:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        return self.partial_dir / f"sha256-{_check_hex(sha256_hex)}.partial"

    def _manifest_path(self, canonical: str) -> Path:
        return self.manifests_dir / f"{canonical}.json"

    def _manifests(self) -> Iterator[Path]:
        if not self.manifests_dir.is_dir():
            return
        for path in self.manifests_dir.rglob("*.json"):
            if not path.name.startswith("."):
                yield path

    def _read_manifest(self, path: Path) -> ModelRecord | None:
        try:
            return msgspec.json.decode(path.read_bytes(), type=ModelRecord)
        except (OSError, msgspec.DecodeError):
            # A damaged manifest must not hide every other model from listings.
            return None

    def list(self) -> builtins.list[ModelRecord]:
        records = [r for p in self._manifests() if (r := self._read_manifest(p)) is not None]
        return sorted(records, key=lambda r: r.name)

    def find(self, name: str) -> ModelRecord | None:
        path = self._manifest_path(canonical_name(name))
        return self._read_manifest(path) if path.is_file() else None

    def get(self, name: str) -> ModelRecord:
        record = self.find(name)
        if record is None:
            raise ModelNotFound(canonical_name(name))
        return record

    def write_manifest(self, record: ModelRecord) -> None:
        """Install ``record`` under its name (atomically); the blobs of a model it replaces
        are deleted once no name uses them."""
        canonical = canonical_name(record.name)
        if canonical != record.name:
            record = msgspec.structs.replace(record, name=canonical)
        previous = self.find(canonical)
        try:
            _atomic_write(self._manifest_path(canonical), msgspec.json.encode(record))
        except OSError as exc:
            raise _storage_error(
                exc,
                f"write the manifest of '{canonical}'",
                noun=f"the manifest of '{canonical}'",
                folder=self.manifests_dir,
                root=self.root,
            ) from exc
        if previous is not None:
            self.collect(*(set(previous.digests()) - set(record.digests())))

    def add_blob(self, tmp_file: Path, sha256_hex: str) -> Path:
        """Move a fully downloaded, already verified file into the blob directory."""
        blob = self.blob_path(sha256_hex)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.exists():
            Path(tmp_file).unlink(missing_ok=True)
            return blob
        try:
            atomic_replace(tmp_file, blob)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise self._blob_error(exc, f"store blob sha256-{sha256_hex}", tmp_file) from exc
            try:
                _atomic_copy(Path(tmp_file), blob)
            except OSError as copy_exc:
                raise self._blob_error(copy_exc, f"store blob sha256-{sha256_hex}", tmp_file) from copy_exc
            Path(tmp_file).unlink(missing_ok=True)
        return blob

    def _blob_error(self, exc: OSError, what: str, src: Path | str) -> RegistryError:
        return _storage_error(
            exc, what, noun="the model file", folder=self.blobs_dir, root=self.root, needed=_size(src)
        )

    def _place_blob(self, src: Path, blob: Path, *, link: bool) -> None:
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.is_symlink() and not blob.exists():
            blob.unlink()
        if link:
            try:
                blob.symlink_to(src.resolve())
            except FileExistsError:
                pass
            return
        try:
            os.link(src, blob)
            return
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in _NO_HARDLINK:
                raise
        _atomic_copy(src, blob)

    def import_file(
        self,
        src: Path,
        name: str,
        *,
        link: bool = False,
        source: str | None = None,
        expected_sha256: str | None = None,
        settings: ModelSettings | None = None,
        projector: Path | None = None,
        projector_sha256: str | None = None,
    ) -> ModelRecord:
        """Add a local GGUF text model under `name`, replacing any model already called so (a
        diffusion checkpoint in GGUF form is refused: ``registry.imports.import_gguf`` stores
        it as an image model).

        ``projector`` (a vision mmproj file) is placed the same way and recorded with
        the model; ``*_sha256`` are checked against the bytes when given. The manifest
        is written once, last."""
        from .formats import classify_tensors
        from .gguf import check_complete, looks_like_gguf, model_info, read_header

        canonical = canonical_name(name)
        src = Path(src).absolute()
        if not src.is_file():
            raise InvalidModelFile(f"no such file: {src}")
        if not looks_like_gguf(src):
            raise InvalidModelFile(f"{src} is not a GGUF file (bad magic bytes)")
        header = read_header(src)
        if projector is None and classify_tensors(t.name for t in header.tensors) is not None:
            # A diffusion checkpoint in GGUF form is an image model, never a chat model.
            raise InvalidModelFile(
                f"{src} is an image model (a diffusion checkpoint in GGUF form), not a text model "
                "— `blazar import` stores it as an image model"
            )
        info = model_info(header)
        if info.architecture == "clip":
            raise InvalidModelFile(
                f"{src} is a vision projector (mmproj), not a model — give it with its model "
                "(`blazar pull` of the repo brings both)"
            )
        if int(header.values.get("split.count") or 1) > 1:
            raise InvalidModelFile(
                f"{src} is one part of a split model — pull the repo (`blazar pull ORG/REPO:QUANT`), "
                "or merge the parts first (`llama-gguf-split --merge`)"
            )
        # Before hashing: a short file is refused from its header alone, without reading it all.
        check_complete(header, src.stat().st_size, str(src))
        if projector is not None:
            check_complete(read_header(projector), Path(projector).stat().st_size, str(projector))
        sha = self._verified_sha256(src, expected_sha256)
        projector_blob = None
        if projector is not None:
            projector_blob = self.blob_path(self._verified_sha256(Path(projector), projector_sha256))
        blob = self.blob_path(sha)
        for source_file, target in ((src, blob), (projector, projector_blob)):
            if source_file is None or target is None or target.exists():
                continue
            try:
                self._place_blob(Path(source_file), target, link=link)
            except OSError as exc:
                raise self._blob_error(exc, f"import {source_file}", source_file) from exc
        self._write_info(sha, info)

        previous = self.find(canonical)
        now = time.time()
        record = ModelRecord(
            name=canonical,
            digest=f"sha256:{sha}",
            size=src.stat().st_size,
            path=str(blob),
            format="gguf",
            source=source or f"import:{src}",
            created_at=previous.created_at if previous else now,
            modified_at=now,
            settings=settings,
            projector=str(projector_blob) if projector_blob else None,
            blobs=[f"sha256:{projector_blob.name.removeprefix('sha256-')}"] if projector_blob else [],
        )
        self.write_manifest(record)
        return record

    def adopt_blob(self, src: Path, sha256_hex: str, *, link: bool = False) -> str:
        """Make a file from elsewhere the blob ``sha256_hex`` (hardlink, else copy; symlink
        with ``link``), after checking its bytes. Returns how: ``hardlinked``, ``copied``,
        ``symlinked`` or ``already stored``."""
        blob = self.blob_path(sha256_hex)
        if blob.exists():
            return "already stored"
        self._verified_sha256(Path(src), sha256_hex)
        try:
            self._place_blob(Path(src), blob, link=link)
            if link:
                return "symlinked"
            return "hardlinked" if os.stat(blob).st_ino == os.stat(src).st_ino else "copied"
        except OSError as exc:
            raise self._blob_error(exc, f"add {src} to the store", src) from exc

    def add_file(self, src: Path, *, link: bool = False) -> str:
        """Make a local file a blob, hashed once (hardlink, else copy; symlink with ``link``);
        returns its hex sha256. ``InvalidModelFile`` when it cannot be read."""
        src = Path(src).resolve()  # a link to the bytes: link the bytes, not the link
        sha = self._verified_sha256(src, None)
        blob = self.blob_path(sha)
        if not blob.exists():
            try:
                self._place_blob(src, blob, link=link)
            except OSError as exc:
                raise self._blob_error(exc, f"add {src} to the store", src) from exc
        return sha

    @staticmethod
    def _verified_sha256(path: Path, expected: str | None) -> str:
        try:
            sha = sha256_file(path)
        except OSError as exc:
            raise InvalidModelFile(f"cannot read {path}: {exc.strerror or exc}") from exc
        if expected is not None and _check_hex(expected) != sha:
            raise ChecksumMismatch(f"{path} has sha256 {sha}, expected {_check_hex(expected)}")
        return sha

    def remove(self, name: str) -> ModelRecord:
        """Remove a model's manifest, and its blob when no other name still uses it."""
        canonical = canonical_name(name)
        record = self.get(canonical)
        path = self._manifest_path(canonical)
        path.unlink(missing_ok=True)
        fsync_dir(path.parent)
        # Tidy directories left empty by names with '/', never the manifests root itself.
        parent = path.parent
        while parent != self.manifests_dir and parent.is_relative_to(self.manifests_dir):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        self.collect(*record.digests())
        return record

    def used_digests(self) -> set[str]:
        return {d for r in self.list() for d in r.digests()}

    def used_trees(self) -> set[str]:
        """The tree folders (``tree_id``) the installed multi-file models use."""
        return {tree_id(r) for r in self.list() if r.files}

    def is_complete(self, record: ModelRecord) -> bool:
        """Every blob ``record`` names is here (a linked blob whose target vanished is not)."""
        if not record.files:
            return Path(record.path).exists()
        return all(self.has_blob(d) for d in record.digests())

    def materialize(self, record: ModelRecord) -> Path:
        """The path an engine opens for ``record``, laid out on disk: the one function a
        lane needs to run a multi-file model.

        For a multi-file model (``record.files``) the files are laid out once under
        ``trees/<tree_id>/``, each under its own relative name as a relative symlink to its
        blob, so no byte is copied; later calls check the links and return at once. The
        path returned is the tree folder itself when ``record.entry`` is empty (faster-whisper:
        ``WhisperModel(path)`` loads ``model.bin``, ``config.json``, ``tokenizer.json`` and
        ``vocabulary.*`` from it), else that file inside it (piper: ``…/en_US-joe-medium.onnx``,
        with its ``.onnx.json`` beside it, as ``PiperVoice.load`` expects). The tree also holds
        a hidden ``.blazar-model.json`` (kind, format, files) that the memory planner reads.
        A GGUF model's ``record.path`` is returned as it is.

        Raises ``ModelNotFound`` when a blob is missing (pull the model again). Blocking: async
        callers run it in a worker thread. Safe when two processes build one tree at once."""
        if not record.files:
            return Path(record.path)
        folder = self.trees_dir / tree_id(record)
        for f in record.files:
            blob = self.blob_path(f.digest)
            if not blob.exists():
                raise ModelNotFound(
                    record.name,
                    f"model '{record.name}' is missing its file {f.name} ({f.digest[:19]}) — "
                    f"run `blazar pull {record.name}` again",
                )
            link = folder / check_file_name(f.name)
            target = os.path.relpath(blob, link.parent)
            try:
                if link.is_symlink() and os.readlink(link) == target:
                    continue
                link.parent.mkdir(parents=True, exist_ok=True)
                link.unlink(missing_ok=True)
                link.symlink_to(target)
            except FileExistsError:
                continue  # another process made the same link just now
            except OSError as exc:
                raise self._tree_error(exc, record) from exc
        marker = folder / TREE_MARKER
        fields: dict[str, Any] = {"kind": record.kind, "format": record.format, "entry": record.entry}
        fields["files"] = record.files
        if record.facts is not None:
            fields["facts"] = record.facts
        doc = msgspec.json.encode(fields)
        try:
            if not marker.is_file() or marker.read_bytes() != doc:
                _atomic_write(marker, doc)
        except OSError as exc:
            raise self._tree_error(exc, record) from exc
        return folder / record.entry if record.entry else folder

    def _tree_error(self, exc: OSError, record: ModelRecord) -> RegistryError:
        what = f"the files of '{record.name}'"
        return _storage_error(exc, f"lay out {what}", noun=what, folder=self.trees_dir, root=self.root)

    def collect(self, *digests: str) -> None:
        """Delete blobs (with their cached header and split-part folder) no manifest uses."""
        used = self.used_digests()
        for digest in digests:
            if digest in used:
                continue
            sha = _check_hex(digest)
            self.blob_path(sha).unlink(missing_ok=True)
            (self.info_dir / f"sha256-{sha}.json").unlink(missing_ok=True)
            shutil.rmtree(self.shards_dir / f"sha256-{sha}", ignore_errors=True)
        if self.trees_dir.is_dir():
            trees = self.used_trees()
            for folder in self.trees_dir.iterdir():
                if folder.name.startswith("sha256-") and folder.name not in trees:
                    shutil.rmtree(folder, ignore_errors=True)

    def _write_info(self, sha: str, info: ModelInfo) -> None:
        # The cache only saves time; failing to write it must not fail the operation.
        with contextlib.suppress(OSError):
            _atomic_write(self.info_dir / f"sha256-{sha}.json", msgspec.json.encode(info))

    def info(self, name_or_record: str | ModelRecord) -> ModelInfo:
        """GGUF header facts of an installed model, cached on disk by digest."""
        # Here, not at the top: the header reader brings the `gguf` package (and numpy),
        # which listing, finding and removing models never need.
        from .gguf import ModelInfo, read_model_info

        record = self.get(name_or_record) if isinstance(name_or_record, str) else name_or_record
        if record.files:
            # Not GGUF: what listings need, from the manifest (``record.speech`` and
            # ``record.facts`` have the rest).
            facts = record.facts or WeightFacts()
            arch = record.speech.architecture if record.speech else facts.architecture or record.format
            h = facts.hparams
            return ModelInfo(
                architecture=arch,
                parameter_count=facts.parameters or 0,
                file_type=facts.quantization or facts.dtype,
                context_length=facts.context_length,
                block_count=h.get("num_hidden_layers"),
                head_count=h.get("num_attention_heads"),
                head_count_kv=h.get("num_key_value_heads"),
                embedding_length=h.get("hidden_size"),
                vocab_size=h.get("vocab_size") or h.get("n_vocab"),
                tensor_count=0,
                data_offset=0,
            )
        sha = _check_hex(record.digest)
        cache = self.info_dir / f"sha256-{sha}.json"
        with contextlib.suppress(OSError, msgspec.DecodeError):
            cached = msgspec.json.decode(cache.read_bytes(), type=ModelInfo)
            # A cache written before the vocabulary was measured is read again once.
            if cached.token_bytes_max is not None or not cached.vocab_size:
                return cached
        info = read_model_info(record.path)
        self._write_info(sha, info)
        return info

    def template_facts(self, template: str | None) -> TemplateFacts:
        """What a chat template can express (``registry.template``), cached on disk by the
        template's digest: rendering it imports Jinja, which an engine's start should not wait for."""
        from .template import FACTS_VERSION, TemplateFacts, facts_of

        if template is None:
            return TemplateFacts()
        digest = hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()
        cache = self.info_dir / f"template-v{FACTS_VERSION}-{digest}.json"
        with contextlib.suppress(OSError, msgspec.DecodeError):
            return msgspec.json.decode(cache.read_bytes(), type=TemplateFacts)
        facts = facts_of(template)
        # The cache only saves time; failing to write it must not fail the operation.
        with contextlib.suppress(OSError):
            _atomic_write(cache, msgspec.json.encode(facts))
        return facts
