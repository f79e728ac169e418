"""Vector arithmetic of the embeddings routes: shortening, pooling, late chunking. Sans-io.

Late chunking (Günther et al., 2024, as Jina's API offers it): the chunks of one text are
embedded *together*, so each token's vector has seen the whole text, and each chunk's
vector is then the mean of its own tokens' vectors. A chunk embedded alone sees only
itself; a late chunk knows what "it" and "the city" refer to three chunks earlier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = ["LateChunks", "fit_dimensions", "late_chunks", "mean_pool", "normalise"]


def normalise(vector: list[float]) -> list[float]:
    """Unit length (L2), as llama.cpp returns pooled embeddings."""
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def fit_dimensions(vector: list[float], dimensions: int | None, *, model: str) -> list[float]:
    """Cut to ``dimensions`` and normalise again (how Matryoshka-trained models shrink);
    more dimensions than the model gives is a ``DecodeError``."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if dimensions > len(vector):
        raise DecodeError(
            f"invalid field `dimensions`: model '{model}' gives {len(vector)}-dimensional vectors; "
            f"ask for at most {len(vector)}",
            param="dimensions",
        )
    return normalise(vector[:dimensions])


def mean_pool(token_vectors: Sequence[Sequence[float]]) -> list[float]:
    """The normalised mean of some tokens' vectors (llama.cpp's mean pooling)."""
    if not token_vectors:
        raise ValueError("no token vectors to pool")
    width = len(token_vectors[0])
    sums = [0.0] * width
    for vec in token_vectors:
        for j, x in enumerate(vec):
            sums[j] += x
    n = len(token_vectors)
    return normalise([x / n for x in sums])


class LateChunks(msgspec.Struct, frozen=True, kw_only=True):
    """One late-chunked input: the tokens sent to the engine and where each chunk lies."""

    tokens: list[int]
    spans: list[tuple[int, int]]
    """``[start, end)`` of each chunk in ``tokens`` (special tokens around them excluded)."""

    def pool(self, token_vectors: Sequence[Sequence[float]]) -> list[list[float]]:
        """A vector per chunk from the engine's vector per token of ``tokens``."""
        if len(token_vectors) != len(self.tokens):
            raise ValueError(
                f"the engine gave {len(token_vectors)} token vectors for {len(self.tokens)} tokens"
            )
        return [mean_pool(token_vectors[a:b]) for a, b in self.spans]


def late_chunks(
    chunks: Sequence[Sequence[int]],
    *,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
    max_tokens: int,
) -> LateChunks:
    """Join the chunks' tokens between the model's special tokens (``prefix``, ``suffix``:
    a BOS or ``[CLS]`` … ``[SEP]``). ``DecodeError`` with ``LATE_CHUNKING_TOO_LONG`` when the
    whole is longer than ``max_tokens``; an empty chunk is refused (it has no tokens to pool)."""
    tokens = list(prefix)
    spans: list[tuple[int, int]] = []
    for i, chunk in enumerate(chunks):
        if not chunk:
            raise DecodeError(
                f"invalid field `input[{i}]`: an empty chunk has no tokens to pool", param="input"
            )
        spans.append((len(tokens), len(tokens) + len(chunk)))
        tokens += chunk
    tokens += suffix
    if len(tokens) > max_tokens:
        raise DecodeError(
            f"the late-chunked input has {len(tokens)} tokens, more than late_chunking_max_tokens "
            f"({max_tokens}): send fewer or shorter chunks, or raise the limit in config.toml "
            '(`late_chunking_max_tokens`, or the model\'s own under `[models."NAME"]`)',
            code="LATE_CHUNKING_TOO_LONG",
        )
    return LateChunks(tokens=tokens, spans=spans)
