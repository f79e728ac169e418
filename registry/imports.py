"""``blazar import PATH``: a model on disk into the store, whatever form it takes.

This module only chooses who stores it: ``Store.import_file`` (a GGUF text model),
``registry.weights.import_weights`` (a safetensors or MLX directory, a diffusion checkpoint,
a whisper.cpp file) or ``registry.multifile.import_folder`` (a whisper folder, a piper
voice). It sits above all three, so that ``registry.store`` never imports the modules
built on it.

Every function is blocking; async callers run them in a worker thread.
"""

from __future__ import annotations

from pathlib import Path

from .errors import InvalidModelFile
from .formats import classify_tensors
from .gguf import looks_like_gguf, read_header
from .multifile import import_folder
from .store import ModelRecord, ModelSettings, Store
from .weights import import_weights

__all__ = ["attach_projector", "import_gguf", "import_path"]

_KNOWN = (
    "a GGUF file, a diffusion checkpoint (.safetensors, .ckpt, .gguf), a whisper.cpp ggml .bin, "
    "a piper voice (.onnx), or a model folder (Hugging Face safetensors or MLX with config.json, "
    "a CTranslate2 whisper folder)"
)


def _diffusion_gguf(src: Path) -> bool:
    """A readable GGUF file that holds an image model's tensors (a text model's, or anything
    ``Store.import_file`` refuses for another reason, is False: it says why)."""
    try:
        if not src.is_file() or not looks_like_gguf(src):
            return False
        return classify_tensors(t.name for t in read_header(src).tensors) is not None
    except (InvalidModelFile, OSError):
        return False


def import_gguf(
    store: Store,
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
    """A GGUF file under ``name``: ``Store.import_file``, or, for a diffusion checkpoint in
    GGUF form (no projector given), ``import_weights``, which stores it as an image model."""
    src = Path(src).absolute()
    if projector is None and _diffusion_gguf(src):
        return import_weights(
            store, src, name, link=link, source=source, expected_sha256=expected_sha256,
            filename=src.name if src.suffix.lower() == ".gguf" else "model.gguf",
        )  # fmt: skip
    return store.import_file(
        src, name, link=link, source=source, expected_sha256=expected_sha256, settings=settings,
        projector=projector, projector_sha256=projector_sha256,
    )  # fmt: skip


def attach_projector(store: Store, model: str, src: Path, *, link: bool = False) -> ModelRecord:
    """``blazar mmproj MODEL FILE``: give an installed GGUF model the vision projector ``src``
    (an mmproj GGUF, ``general.architecture = clip``), replacing the one it had. Refused: a
    file that is no projector, a short one, or one whose output does not match the model's
    embedding width (made for another model)."""
    import msgspec

    from .gguf import check_complete, model_info

    record = store.get(model)
    if record.format != "gguf" or record.files:
        raise InvalidModelFile(
            f"model '{record.name}' is a {record.format} model: a vision projector (mmproj GGUF) "
            "goes with a GGUF model run by llama.cpp"
        )
    src = Path(src).absolute()
    if not src.is_file() or not looks_like_gguf(src):
        raise InvalidModelFile(f"{src} is not a GGUF file: a vision projector is an mmproj .gguf")
    header = read_header(src)
    if header.values.get("general.architecture") != "clip":
        raise InvalidModelFile(
            f"{src} is not a vision projector (its architecture is "
            f"{header.values.get('general.architecture')!r}, a projector's is 'clip')"
        )
    check_complete(header, src.stat().st_size, str(src))
    projects = header.values.get("clip.vision.projection_dim")
    width = model_info(read_header(record.path)).embedding_length
    if isinstance(projects, int) and width and projects != width:
        raise InvalidModelFile(
            f"{src.name} projects images to {projects} values and '{record.name}' reads {width}: "
            "it was made for another model — use the mmproj file published with this model"
        )
    sha = store.add_file(src, link=link)
    old = Path(record.projector).name.replace("sha256-", "sha256:") if record.projector else None
    blobs = [b for b in record.blobs if b != old] + [f"sha256:{sha}"]
    updated = msgspec.structs.replace(record, projector=str(store.blob_path(sha)), blobs=blobs)
    store.write_manifest(updated)
    return updated


def import_path(store: Store, src: Path, name: str, *, link: bool = False) -> ModelRecord:
    """``blazar import PATH --name NAME``: whatever model ``src`` is, by its own files.

    A folder is a whisper model in CTranslate2 form (``model.bin`` and ``config.json``) or a
    piper voice (``registry.multifile``), else a safetensors or MLX directory; a file is a
    GGUF (``import_gguf``; a diffusion GGUF becomes an image model), a piper ``.onnx``, or a
    diffusion checkpoint or whisper.cpp file (``import_weights``)."""
    src = Path(src).absolute()
    if src.is_dir():
        try:
            top = {p.name for p in src.iterdir() if p.is_file()}
        except OSError as exc:
            raise InvalidModelFile(f"cannot read {src}: {exc.strerror or exc}") from None
        speech = {"model.bin", "config.json"} <= top or (
            "config.json" not in top and any(n.endswith(".onnx") for n in top)
        )
        if speech:
            return import_folder(store, src, name, link=link)
        return import_weights(store, src, name, link=link)
    if src.suffix == ".onnx":
        return import_folder(store, src, name, link=link)
    if not src.is_file():
        raise InvalidModelFile(f"no such file or folder: {src}")
    if looks_like_gguf(src):
        return import_gguf(store, src, name, link=link, source=f"import:{src}")
    try:
        return import_weights(store, src, name, link=link)
    except InvalidModelFile as exc:
        message = f"{src} is not a model Blazar can store ({exc.message}); it takes {_KNOWN}"
        raise InvalidModelFile(message) from None
