"""Multi-file models: a whisper folder (CTranslate2, for faster-whisper) and a piper voice.

Each file is a content-addressed blob like any other; the manifest lists them
(``ModelRecord.files``) with the model's kind, and ``Store.materialize`` lays them
out as the engine opens them. This module holds what is particular to such models:
which file an engine opens, the facts their own files state (a piper voice's
``.onnx.json``: language, sample rate, quality, speakers), the record a pull
installs, and the memory a tree's model takes (``registry.fit.estimate_files``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from . import fit, weights
from ._names import canonical_name
from .catalog import CatalogEntry
from .errors import InvalidModelFile, RegistryError
from .store import TREE_MARKER, ModelFile, ModelRecord, SpeechFacts, Store, WeightFacts, check_file_name

__all__ = ["FORMATS", "build_record", "entry_for", "estimate_path", "import_folder", "speech_facts"]

FORMATS = {"ctranslate2": "stt", "onnx": "tts"}
"""Multi-file formats and the kind each is."""
WHISPER_SAMPLE_RATE = 16000
"""Whisper's feature extractor takes 16 kHz audio unless ``preprocessor_config.json`` says otherwise."""


class _Marker(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    format: str
    entry: str = ""
    files: list[ModelFile]
    facts: WeightFacts | None = None


def entry_for(fmt: str, names: Sequence[str]) -> str:
    """The file an engine opens (``""``: the folder): piper opens the ``.onnx`` (its
    ``.onnx.json`` beside it); faster-whisper opens the folder."""
    if fmt == "onnx":
        onnx = [n for n in names if n.endswith(".onnx")]
        if len(onnx) != 1:
            raise InvalidModelFile(f"a piper voice has one .onnx file and its .onnx.json; got {list(names)}")
        if f"{onnx[0]}.json" not in names:
            raise InvalidModelFile(f"the piper voice {onnx[0]} has no {onnx[0]}.json beside it")
        return onnx[0]
    if fmt == "ctranslate2":
        if "model.bin" not in names or "config.json" not in names:
            raise InvalidModelFile(
                f"a CTranslate2 model folder has model.bin and config.json; got {list(names)}"
            )
        return ""
    raise InvalidModelFile(f"unknown multi-file model format {fmt!r} (known: {', '.join(FORMATS)})")


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidModelFile(f"{path.name} is not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidModelFile(f"{path.name} is not a JSON object")
    return doc


def speech_facts(
    fmt: str, folder: Path, entry: str, *, name: str, language: str | None = None
) -> SpeechFacts:
    """What a laid-out speech model's files say; ``language`` (the catalog's) fills a gap."""
    if fmt == "onnx":
        doc = _json(folder / f"{entry}.json")
        audio: dict[str, Any] = doc["audio"] if isinstance(doc.get("audio"), dict) else {}
        lang: dict[str, Any] = doc["language"] if isinstance(doc.get("language"), dict) else {}
        rate, speakers = audio.get("sample_rate"), doc.get("num_speakers")
        return SpeechFacts(
            architecture="piper",
            language=str(lang.get("code") or language or "") or None,
            sample_rate=rate if isinstance(rate, int) else None,
            quality=str(audio["quality"]) if audio.get("quality") else None,
            speakers=speakers if isinstance(speakers, int) else None,
        )
    rate = WHISPER_SAMPLE_RATE
    pre = folder / "preprocessor_config.json"
    if pre.is_file():
        value = _json(pre).get("sampling_rate")
        rate = value if isinstance(value, int) else rate
    if language is None:
        language = "en" if name.endswith(".en") else "multilingual"
    return SpeechFacts(architecture="whisper", language=language, sample_rate=rate)


def build_record(
    store: Store,
    canonical: str,
    entry: CatalogEntry,
    files: Sequence[ModelFile],
    *,
    source: str,
    previous: ModelRecord | None,
) -> ModelRecord:
    """The record of a multi-file model whose blobs are all stored, with its tree laid out
    (the manifest is the caller's to write, last). Blocking."""
    fmt = entry.format or ""
    kind = entry.kind or FORMATS.get(fmt, "")
    if kind not in FORMATS.values():
        raise InvalidModelFile(
            f"catalog entry '{entry.name}': a multi-file model is stt or tts, not {kind!r}"
        )
    names = [check_file_name(f.name) for f in files]
    opened = entry_for(fmt, names)
    main = opened or "model.bin"
    first = next(f for f in files if f.name == main)
    now = time.time()
    record = ModelRecord(
        name=canonical,
        digest=first.digest,
        size=sum(f.size for f in files),
        path="",
        format=fmt,
        kind=kind,
        source=source,
        created_at=previous.created_at if previous else now,
        modified_at=now,
        blobs=sorted({f.digest for f in files if f is not first} - {first.digest}),
        files=list(files),
        entry=opened,
    )
    path = store.materialize(record)
    folder = path.parent if opened else path
    facts = speech_facts(fmt, folder, opened, name=canonical, language=entry.language)
    return msgspec.structs.replace(record, path=str(path), speech=facts)


def estimate_path(path: str | Path, *, slots: int = 1, ctx_per_slot: int = 0) -> fit.Estimate | None:
    """The memory estimate of the model at ``path`` when it is a multi-file model's tree
    (or its entry file), from the tree's marker; None for anything else (a GGUF file).
    ``ctx_per_slot`` sizes the KV cache of a safetensors or MLX directory."""
    p = Path(path)
    for folder in (p, p.parent):
        marker = folder / TREE_MARKER
        if marker.is_file():
            break
    else:
        return None
    try:
        doc = msgspec.json.decode(marker.read_bytes(), type=_Marker)
    except (OSError, msgspec.DecodeError):
        return None
    size = sum(f.size for f in doc.files)
    if doc.format in weights.FORMATS:
        return weights.estimate(doc.kind, doc.format, size, doc.facts, ctx_per_slot=ctx_per_slot, slots=slots)
    return fit.estimate_files(doc.kind, size, slots=slots)


def _local_files(src: Path) -> tuple[str, Path, list[Path]]:
    """(format, folder, files) of a speech model on disk: a CTranslate2 folder (every file at
    its top: model.bin, config.json, tokenizer, vocabulary…) or a piper ``.onnx`` (or a
    folder holding one) with its ``.onnx.json``."""
    if src.is_dir():
        top = sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith("."))
        names = [p.name for p in top]
        if "model.bin" in names and "config.json" in names:
            return "ctranslate2", src, top
        onnx = [p for p in top if p.suffix == ".onnx"]
        if len(onnx) != 1:
            raise InvalidModelFile(
                f"{src}: not a speech model folder — a whisper model (CTranslate2) has model.bin and "
                "config.json; a piper voice has one .onnx and its .onnx.json"
            )
        src = onnx[0]
    if src.suffix != ".onnx" or not src.is_file():
        raise InvalidModelFile(f"{src}: not a piper voice (.onnx) nor a whisper model folder")
    config = src.with_name(f"{src.name}.json")
    if not config.is_file():
        raise InvalidModelFile(f"{src}: the piper voice has no {config.name} beside it")
    return "onnx", src.parent, [src, config]


def import_folder(
    store: Store, src: Path, name: str, *, link: bool = False, language: str | None = None
) -> ModelRecord:
    """Add a speech model from disk under ``name``: a whisper model folder in CTranslate2
    form, or a piper voice's ``.onnx`` (its ``.onnx.json`` beside it). Each file becomes a
    blob (hardlinked, else copied; symlinked with ``link``); the manifest is written last."""
    canonical = canonical_name(name)
    fmt, folder, paths = _local_files(Path(src).absolute())
    files = []
    for path in paths:
        sha = store.add_file(path, link=link)
        files.append(ModelFile(name=path.name, digest=f"sha256:{sha}", size=path.stat().st_size))
    entry = CatalogEntry(name=canonical, format=fmt, language=language, sources=[])
    where = folder if fmt == "ctranslate2" else paths[0]
    try:
        record = build_record(
            store, canonical, entry, files, source=f"import:{where}", previous=store.find(canonical)
        )
    except RegistryError:
        store.collect(*(f.digest for f in files))
        raise
    store.write_manifest(record)
    return record
