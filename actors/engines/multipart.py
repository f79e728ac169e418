"""A ``multipart/form-data`` body read into its fields: what the speech hosts take uploads in.

Sans-io (bytes in, parts out), for the hosts' stdlib HTTP servers, which have no form
parser of their own. OpenAI's audio routes send every field as a part; a file part
carries a filename. Repeated names (``timestamp_granularities[]``) keep every value.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FormError", "Part", "boundary_of", "encode_form", "parse_form"]


class FormError(ValueError):
    """The body is not the multipart form its Content-Type says."""


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    data: bytes
    filename: str | None = None
    content_type: str | None = None

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _params(value: str) -> tuple[str, dict[str, str]]:
    """``form-data; name="file"; filename="a.wav"`` → ``("form-data", {"name": …, …})``."""
    head, _, rest = value.partition(";")
    params: dict[str, str] = {}
    while rest:
        item, rest = _next_param(rest)
        key, eq, val = item.partition("=")
        if eq:
            val = val.strip()
            if len(val) >= 2 and val[0] == val[-1] == '"':
                val = val[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            params[key.strip().lower()] = val
    return head.strip().lower(), params


def _next_param(rest: str) -> tuple[str, str]:
    """The first ``;``-separated item of ``rest`` (a ``;`` inside quotes does not end it)."""
    quoted = False
    for i, ch in enumerate(rest):
        if ch == '"' and (i == 0 or rest[i - 1] != "\\"):
            quoted = not quoted
        elif ch == ";" and not quoted:
            return rest[:i], rest[i + 1 :]
    return rest, ""


def boundary_of(content_type: str) -> str:
    kind, params = _params(content_type)
    if kind != "multipart/form-data":
        raise FormError(f"expected a multipart/form-data body, got Content-Type {content_type or 'none'!r}")
    boundary = params.get("boundary", "")
    if not boundary or len(boundary) > 200:
        raise FormError("the multipart/form-data Content-Type has no usable boundary")
    return boundary


def parse_form(body: bytes, content_type: str) -> dict[str, list[Part]]:
    """Every part of ``body`` by field name, in order. Raises ``FormError`` when malformed."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    start = body.find(delimiter)
    if start < 0:
        raise FormError("the multipart body holds no part (its boundary never appears)")
    fields: dict[str, list[Part]] = {}
    pos = start + len(delimiter)
    while True:
        if body.startswith(b"--", pos):
            return fields  # the closing delimiter
        if not body.startswith(b"\r\n", pos):
            raise FormError("a multipart delimiter is not followed by a line break")
        head_end = body.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise FormError("a multipart part has no end to its headers")
        headers = _headers(body[pos + 2 : head_end])
        data_start = head_end + 4
        end = _part_end(body, b"\r\n" + delimiter, data_start)
        disposition, params = _params(headers.get("content-disposition", ""))
        if disposition != "form-data" or "name" not in params:
            raise FormError("a multipart part has no Content-Disposition: form-data name")
        part = Part(
            name=params["name"],
            data=body[data_start:end],
            filename=params.get("filename"),
            content_type=headers.get("content-type"),
        )
        fields.setdefault(part.name, []).append(part)
        pos = end + 2 + len(delimiter)


def _part_end(body: bytes, marker: bytes, start: int) -> int:
    """Where the part starting at ``start`` ends: the next delimiter that is followed by a
    line break or the closing ``--`` (bytes like the boundary inside data do not count)."""
    while (end := body.find(marker, start)) >= 0:
        after = end + len(marker)
        if body.startswith((b"\r\n", b"--"), after):
            return end
        start = end + 1
    raise FormError("the multipart body ends inside a part (truncated upload?)")


def _headers(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "") + '"'


def encode_form(parts: list[Part], boundary: str) -> bytes:
    """``parts`` as a ``multipart/form-data`` body delimited by ``boundary`` (``parse_form``
    reads it back to the same parts): a stored upload replayed without some of its fields."""
    delimiter = b"--" + boundary.encode("latin-1")
    out = bytearray()
    for part in parts:
        head = f"Content-Disposition: form-data; name={_quoted(part.name)}"
        if part.filename is not None:
            head += f"; filename={_quoted(part.filename)}"
        if part.content_type is not None:
            head += f"\r\nContent-Type: {part.content_type}"
        out += delimiter + b"\r\n" + head.encode("utf-8") + b"\r\n\r\n" + part.data + b"\r\n"
    out += delimiter + b"--\r\n"
    return bytes(out)
