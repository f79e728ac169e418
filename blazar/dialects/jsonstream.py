"""Pieces of JSON read as they arrive, for model output streamed a few characters at a time.

``StringReader`` decodes the inside of a JSON string incrementally: an escape
or a surrogate pair split between two chunks is held until it is whole, so the
text it returns is always final. ``ValueScanner`` finds where a raw JSON value
ends without decoding it. ``complete_prefix`` closes a JSON text that was cut
off (by an output cap) into valid JSON holding everything that was complete.
All of it works on ``str``; bytes are decoded before (``Utf8Feed``).
"""

from __future__ import annotations

import codecs
import re

__all__ = ["StringReader", "Utf8Feed", "ValueScanner", "complete_prefix"]

_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_SPECIAL = re.compile(r'["\\]')
_HEX = frozenset("0123456789abcdefABCDEF")
WHITESPACE = " \t\r\n"


class Utf8Feed:
    """Bytes in, text out; a multi-byte character split between chunks waits for its end."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StringReader:
    """The characters of one JSON string, after its opening quote.

    ``feed`` returns the decoded text that is final and the index in the chunk
    just past the closing quote (None while the string is still open).
    """

    def __init__(self) -> None:
        self._pending = ""
        """An escape sequence not yet whole (``\\``, ``\\u00``, or a high surrogate's ``\\uXXXX``)."""
        self.closed = False

    def feed(self, chunk: str) -> tuple[str, int | None]:
        out: list[str] = []
        data = self._pending + chunk
        offset = len(self._pending)  # indexes in ``data`` are this much ahead of ``chunk``
        self._pending = ""
        i, n = 0, len(data)
        while i < n:
            m = _SPECIAL.search(data, i)
            if m is None:
                out.append(data[i:])
                break
            at = m.start()
            out.append(data[i:at])
            if data[at] == '"':
                self.closed = True
                return "".join(out), at + 1 - offset
            used = self._escape(data, at, out)
            if used == 0:
                self._pending = data[at:]
                break
            i = at + used
        return "".join(out), None

    def _escape(self, data: str, at: int, out: list[str]) -> int:
        """Decode the escape at ``data[at]`` (a backslash) into ``out``; return the
        characters it used, or 0 when it is cut off at the end of ``data``."""
        if at + 1 >= len(data):
            return 0
        kind = data[at + 1]
        if kind != "u":
            out.append(_SIMPLE_ESCAPES.get(kind, kind))
            return 2
        code = _hex4(data, at + 2)
        if code is None:
            if len(data) < at + 6:
                return 0
            out.append("\ufffd")
            return 2
        if 0xD800 <= code < 0xDC00:
            # A high surrogate: its pair follows as a second escape.
            tail = data[at + 6 : at + 12]
            if len(tail) < 6 and "\\u".startswith(tail[:2]) and all(c in _HEX for c in tail[2:]):
                return 0  # its pair may be in the next chunk
            low = _hex4(data, at + 8) if data[at + 6 : at + 8] == "\\u" else None
            if low is not None and 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                return 12
            out.append("\ufffd")
            return 6
        out.append("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))
        return 6


def _hex4(data: str, at: int) -> int | None:
    digits = data[at : at + 4]
    if len(digits) < 4 or not all(c in _HEX for c in digits):
        return None
    return int(digits, 16)


class ValueScanner:
    """Finds where one raw JSON value ends, as its text arrives.

    ``feed`` returns the index just past the value's end in the chunk, or None
    while it goes on. A bare number or literal has no end mark of its own:
    ``feed`` reports its end at the first character that cannot belong to it.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._bare = False
        self.started = False

    def feed(self, chunk: str) -> int | None:
        for i, c in enumerate(chunk):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return i + 1
                continue
            if self._bare:
                if c in WHITESPACE or c in ",]}":
                    return i
                continue
            if not self.started and c in WHITESPACE:
                continue
            self.started = True
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
            elif self._depth == 0:
                self._bare = True
        return None


def complete_prefix(text: str) -> str:
    """Valid JSON from a prefix of a JSON value: the cut-off string is closed, an unfinished
    key, number or literal is dropped, and the open arrays and objects are closed.

    ``{"city": "Par`` gives ``{"city": "Par"}``; ``{"a": 1, "b`` gives ``{"a": 1}``.
    Text that is not the start of a JSON value gives ``""``.
    """
    stack: list[str] = []
    cut = 0  # where the text can be cut so that closing ``stack`` makes it whole
    cut_stack = ""
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in WHITESPACE or c in ",:":
            if c == "," and stack and stack[-1] == "}":
                expect_key = True
            i += 1
            continue
        if c == '"':
            end, closed = _string_end(text, i + 1)
            if expect_key:
                if not closed:
                    break
                expect_key = False
                i = end
                continue
            if not closed:
                return text[: i + 1] + _whole_escapes(text[i + 1 :]) + '"' + "".join(reversed(stack))
            i = end
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            expect_key = c == "{"
            i += 1
            cut, cut_stack = i, "".join(reversed(stack))
            continue
        elif c in "}]":
            if not stack:
                break
            stack.pop()
            i += 1
        else:
            m = _BARE.match(text, i)
            if m is None or m.end() == n:
                break  # not JSON, or a number or literal that may go on
            i = m.end()
        if not stack:
            return text[:i]
        cut, cut_stack = i, "".join(reversed(stack))
    if cut == 0:
        return ""
    return text[:cut].rstrip(WHITESPACE + ",") + cut_stack


_BARE = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")


def _string_end(text: str, start: int) -> tuple[int, bool]:
    """The index past a string's closing quote (``start`` is past its opening one)."""
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1, True
        else:
            i += 1
    return n, False


def _whole_escapes(body: str) -> str:
    """``body`` (a string cut off before its closing quote) without an escape cut off at its
    end; a high surrogate whose pair was cut off goes too."""
    i, n, whole = 0, len(body), 0
    while i < n:
        if body[i] != "\\":
            i += 1
        elif i + 1 >= n:
            break
        elif body[i + 1] != "u":
            i += 2
        else:
            code = _hex4(body, i + 2)
            if code is None:
                break
            if 0xD800 <= code < 0xDC00:
                if body[i + 6 : i + 8] != "\\u" or _hex4(body, i + 8) is None:
                    break
                i += 12
            else:
                i += 6
        whole = i
    return body[:whole]
