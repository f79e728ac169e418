"""LoRA adapters of installed models: checked against their base, kept as blobs, listed.

An adapter is a GGUF file as llama.cpp's ``convert_lora_to_gguf.py`` writes it:
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, the
base model's ``general.architecture``, and a pair of tensors per adapted weight,
``<weight>.lora_a`` and ``<weight>.lora_b``. llama.cpp refuses an adapter whose
architecture or shapes differ from the model only when the engine starts, so we
check the same rules here, when the adapter is added, from the headers alone:

- ``lora_a`` has the base weight's input width and ``lora_b`` its output width
  (GGUF order: ``a = [in, rank]``, ``b = [rank, out]``);
- both sides of a pair have the same rank;
- every adapted weight exists in the model.

Adapters live in the model's manifest (``ModelRecord.adapters``), their bytes in
the blob store under their sha256, so removing the model (or the adapter) removes
the blob once nothing else uses it. Blocking: async callers run these in a thread.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec

from .errors import AdapterMismatch, AdapterNotFound, InvalidAdapter, InvalidModelFile
from .gguf import GGUFHeader, looks_like_gguf, read_header
from .store import Adapter, ModelRecord, Store

__all__ = [
    "AdapterFacts",
    "add_adapter",
    "check_adapter",
    "find_adapter",
    "read_adapter",
    "remove_adapter",
    "set_scales",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def gguf_model(store: Store, model: str, mismatch: type[Exception], what: str) -> ModelRecord:
    """``model``'s record, refused with ``mismatch`` unless it is one GGUF file (what
    ``what``, a LoRA adapter or a control vector, applies to)."""
    record = store.get(model)
    if record.format != "gguf" or record.files:
        raise mismatch(
            f"model '{record.name}' is a {record.format} model: {what} apply to GGUF models run by llama.cpp"
        )
    return record


def attachment_name(name: str | None, src: Path, invalid: type[Exception], what: str) -> str:
    """The name an attached file goes by: ``name``, else its file name less ``.gguf``;
    refused with ``invalid`` unless it is a usable one."""
    name = name or src.name.removesuffix(".gguf")
    if not _NAME.match(name):
        raise invalid(
            f"{name!r} is not a usable {what} name — use letters, digits, '.', '_' and '-' "
            "(at most 64), starting with a letter or digit; give one with --name"
        )
    return name


_SUFFIXES = (".lora_a", ".lora_b")


class AdapterFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What an adapter's GGUF header says."""

    architecture: str
    alpha: float | None
    rank: int | None
    """The rank of its pairs (the first pair's; ``check_adapter`` checks they agree)."""
    shapes: dict[str, tuple[list[int], list[int]]]
    """Adapted weight → (``lora_a`` shape, ``lora_b`` shape), GGUF order."""


def read_adapter(path: Path) -> AdapterFacts:
    """The facts of a LoRA adapter file; ``InvalidAdapter`` when it is not one."""
    if not path.is_file():
        raise InvalidAdapter(f"no such file: {path}")
    if not looks_like_gguf(path):
        raise InvalidAdapter(
            f"{path} is not a GGUF file — convert the adapter with llama.cpp's convert_lora_to_gguf.py"
        )
    try:
        header = read_header(path)
    except InvalidModelFile as exc:
        raise InvalidAdapter(exc.message) from None
    return _facts(path, header)


def _facts(path: Path, header: GGUFHeader) -> AdapterFacts:
    values = header.values
    kind, adapter = values.get("general.type"), values.get("adapter.type")
    if kind != "adapter" or adapter != "lora":
        said = f"general.type = {kind!r}, adapter.type = {adapter!r}"
        raise InvalidAdapter(
            f"{path} is not a LoRA adapter ({said}; an adapter has general.type = 'adapter' and "
            "adapter.type = 'lora') — a whole model is installed with `blazar import`"
        )
    arch = values.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidAdapter(f"{path} does not name its base architecture (general.architecture)")
    halves: dict[str, dict[str, list[int]]] = {}
    for t in header.tensors:
        for suffix in _SUFFIXES:
            if t.name.endswith(suffix):
                halves.setdefault(t.name.removesuffix(suffix), {})[suffix] = list(t.shape)
    if not halves:
        raise InvalidAdapter(f"{path} has no LoRA tensors (<weight>.lora_a / <weight>.lora_b)")
    shapes: dict[str, tuple[list[int], list[int]]] = {}
    for weight, pair in sorted(halves.items()):
        if len(pair) != 2:
            raise InvalidAdapter(f"{path}: the LoRA pair of '{weight}' lacks one of lora_a / lora_b")
        shapes[weight] = (pair[".lora_a"], pair[".lora_b"])
    alpha = values.get("adapter.lora.alpha")
    first_a = next(iter(shapes.values()))[0]
    return AdapterFacts(
        architecture=arch,
        alpha=float(alpha) if isinstance(alpha, (int, float)) else None,
        rank=first_a[1] if len(first_a) > 1 else None,
        shapes=shapes,
    )


def check_adapter(facts: AdapterFacts, model: ModelRecord, model_header: GGUFHeader) -> None:
    """Refuse (``AdapterMismatch``) an adapter llama.cpp would refuse on ``model``: another
    architecture, a weight the model lacks, or shapes that do not fit it."""
    arch = model_header.values.get("general.architecture")
    if facts.architecture != arch:
        raise AdapterMismatch(
            f"the adapter was made for a '{facts.architecture}' model, and '{model.name}' is '{arch}' "
            "— add it to a model of its own base (`blazar show NAME` gives a model's architecture)"
        )
    weights = {t.name: list(t.shape) for t in model_header.tensors}
    for weight, (a, b) in facts.shapes.items():
        base = weights.get(weight)
        if base is None:
            raise AdapterMismatch(
                f"the adapter changes '{weight}', which model '{model.name}' does not have — "
                "it was made for another model of the same architecture"
            )
        if len(a) != 2 or len(b) != 2 or len(base) < 2:
            raise AdapterMismatch(f"the adapter's tensors for '{weight}' are not matrices")
        if a[1] != b[0]:
            raise AdapterMismatch(
                f"the adapter's pair for '{weight}' has ranks {a[1]} and {b[0]}: lora_a must be stored "
                "transposed ([in, rank]) — convert it again with llama.cpp's convert_lora_to_gguf.py"
            )
        if a[0] != base[0] or b[1] != base[1]:
            raise AdapterMismatch(
                f"the adapter's '{weight}' maps {a[0]} → {b[1]}, and the model's is {base[0]} → {base[1]} "
                f"— it was made for another size of '{facts.architecture}' model than '{model.name}'"
            )


def find_adapter(record: ModelRecord, which: str | int) -> tuple[int, Adapter]:
    """The adapter ``which`` (its name, or its number) of ``record``, with its number."""
    for i, adapter in enumerate(record.adapters):
        if adapter.name == which or (isinstance(which, int) and which == i):
            return i, adapter
    have = ", ".join(f"{i}: {a.name}" for i, a in enumerate(record.adapters)) or "none"
    raise AdapterNotFound(
        f"model '{record.name}' has no LoRA adapter {which!r} (it has {have}) — "
        f"see `blazar lora list {record.name}`, or add one with `blazar lora add {record.name} FILE.gguf`"
    )


def add_adapter(
    store: Store,
    model: str,
    src: Path,
    *,
    name: str | None = None,
    scale: float = 1.0,
    link: bool = False,
) -> tuple[ModelRecord, Adapter]:
    """Check ``src`` against ``model``, store its bytes as a blob and record it in the model's
    manifest (replacing an adapter of the same name). Returns the new record and adapter."""
    record = gguf_model(store, model, AdapterMismatch, "LoRA adapters in GGUF form")
    src = Path(src).absolute()
    facts = read_adapter(src)
    name = attachment_name(name, src, InvalidAdapter, "adapter")
    if not (-10.0 <= scale <= 10.0):
        raise InvalidAdapter(f"scale {scale} is out of range: give one between -10 and 10 (1 is the default)")
    check_adapter(facts, record, read_header(record.path))
    sha = store.add_file(src, link=link)
    adapter = Adapter(
        name=name,
        digest=f"sha256:{sha}",
        size=src.stat().st_size,
        scale=scale,
        alpha=facts.alpha,
        rank=facts.rank,
        added_at=time.time(),
    )
    adapters = [a for a in record.adapters if a.name != name]
    position = next((i for i, a in enumerate(record.adapters) if a.name == name), len(adapters))
    adapters.insert(position, adapter)
    updated = msgspec.structs.replace(record, adapters=adapters, modified_at=time.time())
    store.write_manifest(updated)
    return updated, adapter


def set_scales(store: Store, model: str, scales: list[tuple[str | int, float]]) -> ModelRecord:
    """Give adapters of ``model`` (by name or number) the scales they start with; the others
    keep theirs. All checked before any is written."""
    record = store.get(model)
    adapters = list(record.adapters)
    for which, scale in scales:
        if not (-10.0 <= scale <= 10.0):
            raise InvalidAdapter(
                f"scale {scale} is out of range: give one between -10 and 10 (0 turns it off)"
            )
        i, adapter = find_adapter(record, which)
        adapters[i] = msgspec.structs.replace(adapter, scale=scale)
    updated = msgspec.structs.replace(record, adapters=adapters, modified_at=time.time())
    store.write_manifest(updated)
    return updated


def remove_adapter(store: Store, model: str, name: str) -> tuple[ModelRecord, Adapter]:
    """Drop adapter ``name`` from ``model`` (its blob goes once nothing else uses it)."""
    record = store.get(model)
    _, adapter = find_adapter(record, name)
    adapters = [a for a in record.adapters if a.name != adapter.name]
    updated = msgspec.structs.replace(record, adapters=adapters, modified_at=time.time())
    store.write_manifest(updated)
    return updated, adapter
