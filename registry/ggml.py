"""whisper.cpp's ggml model files (``ggml-tiny.en.bin``): recognised from their header alone.

Such a file starts with the magic ``0x67676d6c`` (``ggml``, little-endian), then eleven
int32 hyper-parameters: ``n_vocab``, ``n_audio_ctx``, ``n_audio_state``, ``n_audio_head``,
``n_audio_layer``, ``n_text_ctx``, ``n_text_state``, ``n_text_head``, ``n_text_layer``,
``n_mels`` and ``ftype``; the mel filters, the vocabulary and the tensors follow and are
never read. The same magic opened llama.cpp's files before GGUF, so the values are checked
against a whisper model's shape (80 or 128 mel bins, equal audio and text widths) before
the file is taken for one. Pure but for ``read_whisper_header``.
"""

from __future__ import annotations

import os
import struct

import msgspec

__all__ = ["MAGIC", "WhisperHeader", "parse_whisper_header", "read_whisper_header"]

MAGIC = 0x67676D6C
_HEAD = struct.Struct("<I11i")
_QNT_FACTOR = 1000
"""ggml stores ``ftype`` as ``quantization version * 1000 + type``."""
_FTYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1",
           10: "q2_k", 11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k"}  # fmt: skip
"""ggml's ``ggml_ftype`` values (``MOSTLY_Q8_0`` is 7: not the tensor type numbering)."""
_SIZES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}
"""Encoder layers of each whisper size."""
_ENGLISH_VOCAB = 51864
"""The ``.en`` models' vocabulary; the multilingual ones have 51865 (51866 for large-v3)."""


class WhisperHeader(msgspec.Struct, frozen=True, kw_only=True):
    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
    ftype: int

    @property
    def size(self) -> str | None:
        """``tiny``, ``base``, ``small``, ``medium``, ``large`` from the encoder's depth."""
        return _SIZES.get(self.n_audio_layer)

    @property
    def language(self) -> str:
        """``en`` for an English-only model, else ``multilingual``."""
        return "en" if self.n_vocab == _ENGLISH_VOCAB else "multilingual"

    @property
    def quantization(self) -> str:
        """The weights' type: ``f16``, ``q5_1``, … (``ftype N`` for one not known here)."""
        kind = self.ftype % _QNT_FACTOR
        return _FTYPES.get(kind, f"ftype {kind}")

    def hparams(self) -> dict[str, int]:
        return msgspec.structs.asdict(self)


def parse_whisper_header(buf: bytes) -> WhisperHeader | None:
    """The hyper-parameters of a whisper.cpp ggml file from its first 48 bytes; None when
    the bytes are not one's (another magic, or a pre-GGUF llama.cpp file's values)."""
    if len(buf) < _HEAD.size:
        return None
    magic, *values = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        return None
    header = WhisperHeader(**dict(zip(WhisperHeader.__struct_fields__, values, strict=True)))
    shape_ok = (
        header.n_mels in (80, 128)
        and header.n_audio_state == header.n_text_state > 0
        and header.n_audio_ctx > 0
        and header.n_text_ctx > 0
        and header.n_audio_layer > 0
        and header.n_text_layer > 0
        and header.n_audio_head > 0
        and header.n_vocab > 0
    )
    return header if shape_ok else None


def read_whisper_header(path: str | os.PathLike[str]) -> WhisperHeader | None:
    """``parse_whisper_header`` of a file's first bytes; None when unreadable or not one."""
    try:
        with open(path, "rb") as f:
            return parse_whisper_header(f.read(_HEAD.size))
    except OSError:
        return None
