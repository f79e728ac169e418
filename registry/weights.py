"""Models that are not one GGUF file: a Hugging Face safetensors directory, an MLX directory,
a diffusion checkpoint and a whisper.cpp ggml file, in the store.

Each is a multi-file model (``registry.store``): every file a content-addressed blob, the
manifest listing them with the model's format, kind and what the headers say
(``ModelRecord.facts``: architecture, quantization, parameters, context, KV bytes per
token, the weights' size), and ``Store.materialize`` laying them out as the engine opens
them: the directory itself (vLLM, SGLang, MLX), or the one file (sd.cpp, whisper.cpp)
under its own name. What a model is comes from ``registry.formats.detect`` (headers only,
never weights); which lane runs it from ``lane_format`` (``safetensors:awq`` for an AWQ
checkpoint), and what it needs in memory from ``estimate`` (``registry.fit``).

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from . import fit
from ._names import canonical_name
from .errors import ChecksumMismatch, InvalidModelFile, RegistryError
from .formats import ModelFormat, detect
from .ggml import read_whisper_header
from .gguf import check_complete, read_header
from .store import ModelFile, ModelRecord, SpeechFacts, Store, WeightFacts, check_file_name

__all__ = [
    "DIRECTORY_FORMATS",
    "FORMATS",
    "MAX_FILES",
    "estimate",
    "import_weights",
    "kind_of",
    "lane_format",
    "select_files",
]

FORMATS = {"safetensors": "chat", "mlx": "chat", "diffusion": "image", "ggml-whisper": "stt"}
"""The formats this module stores, and the kind each is unless its files say otherwise
(a safetensors directory of a sentence-embedding model is ``embedding``)."""
DIRECTORY_FORMATS = frozenset({"safetensors", "mlx"})
"""Formats whose engine opens the directory (the others open one file)."""
MAX_FILES = 4096
"""A folder with more files than this is not a model directory (a mistaken path)."""
WHISPER_SAMPLE_RATE = 16000
_MAX_DEPTH = 6
"""Folders below a model directory's top that are read (repos nest two or three deep)."""

_OTHER_WEIGHTS = (".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".h5", ".msgpack", ".onnx",
                  ".onnx_data", ".gguf", ".npz", ".ot", ".tflite", ".mlmodel", ".pkl", ".pickle")  # fmt: skip
"""Weight files a repo may carry beside the ones its format loads (PyTorch ``.bin``, the
original ``consolidated.*.pth``, ONNX exports…): left out, or a directory would be stored
two or three times over."""
_EMBEDDING_MARKERS = ("modules.json", "sentence_bert_config.json")
"""sentence-transformers' files: the directory is an embedding model."""
_HPARAMS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
            "intermediate_size", "head_dim")  # fmt: skip


def lane_format(record: ModelRecord) -> str:
    """What routing matches a lane's formats against: ``safetensors:awq`` for a quantized
    checkpoint, else the manifest's format (``registry.formats.ModelFormat.lane_format``)."""
    facts = record.facts
    if record.format == "safetensors" and facts is not None and facts.quantization:
        return f"safetensors:{facts.quantization}"
    return record.format


def _config(folder: Path) -> dict[str, Any]:
    try:
        doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def kind_of(fmt: ModelFormat, folder: Path | None) -> str:
    """The kind of a detected model: ``image`` for a diffusion checkpoint, ``stt`` for a
    whisper.cpp file, ``embedding`` for a directory that sentence-transformers describes or
    whose architecture is a bare encoder (``BertModel``), else ``chat``."""
    kind = FORMATS.get(fmt.format, "chat")
    if kind != "chat" or folder is None:
        return kind
    if any((folder / marker).is_file() for marker in _EMBEDDING_MARKERS):
        return "embedding"
    arch = fmt.architecture or ""
    if arch.endswith("Model") and "For" not in arch:
        return "embedding"
    return "chat"


def select_files(folder: Path, fmt: ModelFormat) -> list[tuple[str, Path]]:
    """``(name inside the model, path)`` of every file a directory model keeps: its weights as
    ``fmt`` found them, and every other file (config, tokenizer, generation config, chat
    template, nested folders) but hidden ones and other copies of the weights."""
    weights = set(fmt.files)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        here = Path(dirpath)
        deep = len(here.relative_to(folder).parts) >= _MAX_DEPTH  # a symlink loop ends here too
        dirnames[:] = [] if deep else sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = here / name
            rel = path.relative_to(folder).as_posix()
            if name.startswith(".") or not path.is_file():
                continue
            if rel not in weights and name.lower().endswith(_OTHER_WEIGHTS):
                continue
            found.append((rel, path))
            if len(found) > MAX_FILES:
                raise InvalidModelFile(
                    f"{folder} holds more than {MAX_FILES} files: not a model directory — give the "
                    "folder with config.json and the weights"
                )
    names = {rel for rel, _ in found}
    if missing := sorted(weights - names):
        raise InvalidModelFile(f"{folder}: {', '.join(missing[:3])} cannot be read")
    return sorted(found)


def _facts(fmt: ModelFormat, folder: Path | None, weights_bytes: int) -> WeightFacts:
    hparams: dict[str, int] = {}
    if folder is not None:
        config = _config(folder)
        text = config.get("text_config")
        source = text if isinstance(text, dict) and "num_hidden_layers" in text else config
        hparams = {k: v for k in _HPARAMS if isinstance(v := source.get(k), int) and not isinstance(v, bool)}
    return WeightFacts(
        architecture=fmt.architecture,
        quantization=fmt.quantization,
        parameters=fmt.parameters,
        dtype=fmt.dtype,
        container=fmt.container,
        context_length=fmt.context_length,
        kv_bytes_per_token=fmt.kv_bytes_per_token,
        weights_bytes=weights_bytes,
        hparams=hparams,
    )


def _record(
    store: Store,
    canonical: str,
    fmt: ModelFormat,
    files: Sequence[ModelFile],
    *,
    kind: str,
    facts: WeightFacts,
    speech: SpeechFacts | None,
    source: str,
    previous: ModelRecord | None,
) -> ModelRecord:
    """The record of a model whose blobs are all stored, with its tree laid out."""
    directory = fmt.format in DIRECTORY_FORMATS
    entry = "" if directory else files[0].name
    main = next((f for f in files if f.name == ("config.json" if directory else entry)), files[0])
    now = time.time()
    record = ModelRecord(
        name=canonical,
        digest=main.digest,
        size=sum(f.size for f in files),
        path="",
        format=fmt.format,
        kind=kind,
        source=source,
        created_at=previous.created_at if previous else now,
        modified_at=now,
        blobs=sorted({f.digest for f in files} - {main.digest}),
        files=list(files),
        entry=entry,
        speech=speech,
        facts=facts,
    )
    return msgspec.structs.replace(record, path=str(store.materialize(record)))


def import_weights(
    store: Store,
    src: Path,
    name: str,
    *,
    link: bool = False,
    source: str | None = None,
    expected_sha256: str | None = None,
    filename: str | None = None,
) -> ModelRecord:
    """Add a safetensors or MLX directory, a diffusion checkpoint (``.safetensors``, ``.ckpt``,
    ``.gguf``) or a whisper.cpp ggml file under ``name``, replacing any model so called.

    Each file becomes a blob (hardlinked, else copied; symlinked with ``link``; the bytes of
    a symlink, such as a Hugging Face snapshot's, are what is linked); the manifest is
    written last. ``filename`` names a single file inside the model (default: its own name;
    a blob named by its hash gets one an engine recognises). ``expected_sha256`` checks a
    single file's bytes. Raises ``InvalidModelFile`` for anything else (a GGUF text model is
    ``Store.import_file``'s; ``registry.imports.import_path`` chooses)."""
    canonical = canonical_name(name)
    src = Path(src).absolute()
    fmt = detect(src)
    if fmt.format not in FORMATS:
        raise InvalidModelFile(f"{src} is a {fmt.format} model, not a directory or checkpoint of weights")
    folder = src if src.is_dir() else None
    if folder is not None and fmt.format in DIRECTORY_FORMATS:
        pairs = select_files(folder, fmt)
        weights = set(fmt.files) - {"config.json"}
    else:
        path = folder / fmt.files[0] if folder is not None else src
        pairs = [(check_file_name(filename or path.name), path)]
        weights = {pairs[0][0]}
        if fmt.container == "gguf":  # refused from its header alone, before hashing it
            check_complete(read_header(path), path.stat().st_size, str(path))
    files: list[ModelFile] = []
    try:
        for rel, path in pairs:
            sha = store.add_file(path, link=link)
            size = path.stat().st_size
            files.append(ModelFile(name=check_file_name(rel), digest=f"sha256:{sha}", size=size))
        if expected_sha256 is not None and len(files) == 1:
            want = expected_sha256.lower().removeprefix("sha256:")
            if files[0].digest != f"sha256:{want}":
                raise ChecksumMismatch(f"{src} has {files[0].digest}, expected sha256:{want}")
        weights_bytes = sum(f.size for f in files if f.name in weights)
        facts = _facts(fmt, folder if fmt.format in DIRECTORY_FORMATS else None, weights_bytes)
        speech = None
        if fmt.format == "ggml-whisper":
            header = read_whisper_header(src)
            if header is not None:
                facts = msgspec.structs.replace(facts, hparams=header.hparams())
                speech = SpeechFacts(architecture="whisper", language=header.language,
                                     sample_rate=WHISPER_SAMPLE_RATE)  # fmt: skip
        kind = kind_of(fmt, folder if fmt.format in DIRECTORY_FORMATS else None)
        record = _record(
            store, canonical, fmt, files, kind=kind, facts=facts, speech=speech,
            source=source or f"import:{src}", previous=store.find(canonical),
        )  # fmt: skip
    except (RegistryError, OSError):
        store.collect(*(f.digest for f in files))
        raise
    store.write_manifest(record)
    return record


def estimate(kind: str, fmt: str, file_bytes: int, facts: WeightFacts | None, *,
             ctx_per_slot: int, slots: int) -> fit.Estimate:  # fmt: skip
    """The memory a stored model of ``fmt`` needs (``registry.fit.estimate_weights``; a
    whisper.cpp file as a speech model, its weights kept as stored)."""
    if fmt == "ggml-whisper":
        return fit.estimate_files(kind, file_bytes, slots=slots, widen=1)
    weights = (facts.weights_bytes if facts else None) or file_bytes
    per_token = facts.kv_bytes_per_token if facts and kind in ("chat", "embedding") else None
    return fit.estimate_weights(
        kind, weights, kv_bytes_per_token=per_token or 0, ctx_per_slot=ctx_per_slot, slots=slots
    )
