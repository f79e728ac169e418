"""The registry's exception tree; each error carries the stable ``code`` the gateway serves."""

from __future__ import annotations

__all__ = [
    "AdapterMismatch",
    "AdapterNotFound",
    "ChecksumMismatch",
    "InsufficientStorage",
    "InvalidAdapter",
    "InvalidModelFile",
    "InvalidModelName",
    "ModelExists",
    "ModelFileIncomplete",
    "ModelKindMismatch",
    "ModelNotFound",
    "PullFailed",
    "RegistryError",
]


class RegistryError(Exception):
    """Base of every error the model store raises on purpose: a ``code`` (``blazar_code``),
    a ``message`` that says what to do next and, where waiting helps, ``retry_after_s``."""

    code: str = "BAD_REQUEST"
    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(RegistryError):
    code = "MODEL_NOT_FOUND"

    def __init__(self, name: str, message: str | None = None) -> None:
        self.name = name
        super().__init__(
            message or f"model '{name}' is not installed — run `blazar pull {name}` or see `blazar list`"
        )


class ModelKindMismatch(RegistryError):
    """A model sent to a route of another kind: a speech model to chat, a chat model to speech."""

    code = "MODEL_KIND_MISMATCH"

    def __init__(self, name: str, kind: str, message: str) -> None:
        self.name = name
        self.kind = kind
        super().__init__(message)


class ModelExists(RegistryError):
    code = "MODEL_EXISTS"

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"a model called '{name}' already exists — pick another name or `blazar rm {name}` first"
        )


class InvalidModelName(RegistryError):
    code = "BAD_REQUEST"


class InvalidModelFile(RegistryError):
    code = "BAD_REQUEST"


class ModelFileIncomplete(InvalidModelFile):
    """A GGUF file shorter than its own header says: a download or copy that stopped early."""

    code = "MODEL_FILE_INCOMPLETE"

    def __init__(self, what: str, *, expected: int, found: int, advice: str = "re-download it") -> None:
        self.expected = expected
        self.found = found
        super().__init__(f"{what} is incomplete (expected {expected} bytes, found {found}) — {advice}")


class PullFailed(RegistryError):
    code = "BAD_GATEWAY"


class ChecksumMismatch(PullFailed):
    pass


class InsufficientStorage(RegistryError):
    code = "INSUFFICIENT_STORAGE"


class InvalidAdapter(RegistryError):
    """A file given as a LoRA adapter that is not one (not GGUF, or not ``adapter.type = lora``)."""

    code = "LORA_INVALID"


class AdapterMismatch(RegistryError):
    """A LoRA adapter made for another base model: its architecture or its tensors' shapes differ."""

    code = "LORA_MISMATCH"


class AdapterNotFound(RegistryError):
    """A model has no adapter of that name (or number)."""

    code = "LORA_NOT_FOUND"
