"""What an engine quietly did less than it was asked at start, read from its own log.

llama.cpp does not fail when it cannot honour some of its flags: it writes a warning
and goes on with less (a context capped to the training length, weights that could not
be locked in RAM, a model file read instead of mapped, flash attention forced off).
``parse`` turns those startup lines into named degrades, each with the engine's own line
(its timestamp and level dropped, local paths replaced), so that every answer the engine
serves can name them (``X-Blazar-Warnings``) and ``blazar why`` can quote them.

Pure: text in, degrades out. The patterns are the wording of the llama.cpp bundled in the
``xllamacpp`` wheel (and of ``llama-server`` builds of the same era); a line it does not
know is not a degrade.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["DEGRADES", "Degrade", "names", "parse", "scrub"]


class Degrade(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    """A stable name (``DEGRADES``)."""
    line: str
    """The engine's own log line that said so, local paths replaced by ``<path>``."""


DEGRADES = {
    "ctx_reduced": "the engine serves a smaller context than it was started with",
    "mlock_failed": "the model's weights could not be locked in RAM (--mlock): they may be paged out",
    "mmap_fallback": "the model file could not be memory-mapped and was read into memory instead",
    "flash_attn_off": "flash attention was asked for (or left to the engine) and is off",
    "flash_attn_cpu": "flash attention runs on the CPU: the GPU backend does not support it",
    "buffer_fallback": "weights or adapters meant for a device were kept in another buffer (the CPU)",
}
"""Each engine degrade's name, and what it means."""

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        # server: "the slot context (100096) exceeds the training context of the model (8192) - capping"
        ("ctx_reduced", r"exceeds the training context of the model \(\d+\) - capping"),
        ("ctx_reduced", r"capping per-slot context \(\d+\) to"),
        ("ctx_reduced", r"context size reduced from \d+ to \d+"),
        # llama-mmap: "warning: failed to mlock 31866880-byte buffer (after previously locking 0 bytes): …"
        ("mlock_failed", r"failed to mlock \d+-byte buffer"),
        ("mmap_fallback", r"mmap failed: "),
        ("mmap_fallback", r"[Ff]alling back to buffered I/?O"),
        ("mmap_fallback", r"mmap is not available, so tensor"),
        ("mmap_fallback", r"mmap is not supported on this platform"),
        ("mmap_fallback", r"byte aligned, cannot mmap"),
        ("flash_attn_off", r"flash_attn .*- forcing off"),
        ("flash_attn_off", r"flash attention disabled; "),
        ("flash_attn_off", r"Flash Attention was auto, set to disabled"),
        ("flash_attn_off", r"flash attention not supported by .*memory usage will increase"),
        ("flash_attn_cpu", r"flash attention is not supported by the current backend; falling back to CPU"),
        ("buffer_fallback", r"cannot be used with preferred buffer type \S+, using \S+ instead"),
        ("buffer_fallback", r"cannot use buft '[^']*', fallback to CPU"),
    )
)

# "0.00.565.668 W " (llama.cpp's common log with timestamps and levels); older builds print none.
_PREFIX = re.compile(r"^\s*(?:\d+(?:\.\d+)+\s+)?(?:[DIWE]\s+)?")
# An absolute path: in quotes, or a bare word that starts with "/" or "~/" (or a drive on Windows).
_QUOTED_PATH = re.compile(r"""(['"])(?:/|~/|[A-Za-z]:[\\/])[^'"]*\1""")
_BARE_PATH = re.compile(r"""(?<![\w.:/-])(?:~/|/|[A-Za-z]:[\\/])[^\s'"(),;]+""")
_MAX_LINE = 300


def scrub(line: str) -> str:
    """``line`` without its log prefix, every local path replaced by ``<path>``, and cut to a
    readable length."""
    line = _PREFIX.sub("", line.strip())
    line = _QUOTED_PATH.sub(lambda m: f"{m.group(1)}<path>{m.group(1)}", line)
    line = _BARE_PATH.sub("<path>", line)
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 1] + "…"


def parse(text: str) -> tuple[Degrade, ...]:
    """The degrades an engine's startup log names, in the order of ``DEGRADES``: one per name,
    with the first line that said so."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        for name, pattern in _PATTERNS:
            if name not in found and pattern.search(line):
                found[name] = scrub(line)
    return tuple(Degrade(name=n, line=found[n]) for n in DEGRADES if n in found)


def names(degrades: tuple[Degrade, ...]) -> list[str]:
    return [d.name for d in degrades]
