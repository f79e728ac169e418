"""A minimal OpenAI-compatible upstream that answers at once: the yardstick for gateway overhead.

    python bench/instant_upstream.py --port 8080 [--chunks 32] [--interval-ms 0] [--reply TEXT]

It accepts llama-server's flags (``-m``, ``-c``, ``-np``, ``--host``, ``--port``,
``--api-key``, ``--alias``, ``--metrics`` and any other, ignored), so the daemon
can run it as its engine through ``[engine] llama_server = "bench/instant-upstream"``.
It serves what the gateway asks an engine for: ``GET /health``, ``/slots``,
``/props``, ``/v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions``
(a fixed body, or a stream of ``max_tokens`` chunks, ``--chunks`` without one),
``/tokenize``, ``/detokenize`` and ``/apply-template``; and, as llama.cpp does with the
flags it was started with, ``/v1/embeddings`` (``--embeddings``), ``/embeddings`` (a vector
per token, ``--pooling none``) and ``/v1/rerank`` (``--reranking``), with made-up vectors
and scores that tests can predict (``token_vector``, ``rerank_score``).

Only the standard library (asyncio with a hand-rolled HTTP/1.1 parser), so any
Python 3.11 runs it and it costs a small fraction of the gateway's CPU per request.
A body field ``bench_interval_ms`` overrides ``--interval-ms`` (the pause between
stream chunks) for one request; on a request that is not streamed, the fixed body comes
after that pause times ``max_tokens``, as if decoded.

Two things make it answer like a model rather than a yardstick, for tests that drive the
gateway end to end: ``--reply TEXT`` is the answer of every chat and completion, and a
request whose ``response_format`` carries a JSON schema is answered with a compact instance
of that schema, as an engine's grammar-constrained decoding would. With both, the schema's
alternative that fits the reply is taken, as a model that means the reply would choose it:
the reply itself when it is JSON with the constant values of one alternative, else the
reply as the text of an alternative that is one string property. Either answer is cut into
token-like pieces, streamed one piece per chunk and cut at ``max_tokens`` (finish ``length``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "rerank_score", "token_vector"]

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}
_MAX_HEAD = 64 * 1024


class Upstream:
    """The fixed answers, encoded once."""

    def __init__(
        self,
        alias: str,
        slots: int,
        chunks: int,
        interval_ms: float,
        reply: str | None = None,
        pooling: str | None = None,
    ) -> None:
        self.alias = alias
        self.pooling = pooling
        """``mean``/``none`` with ``--embeddings``, ``rank`` with ``--reranking``, else None."""
        self.reply = reply
        self.slots = slots
        self.chunks = chunks
        self.interval_ms = interval_ms
        created = int(time.time())
        self.chat_body = _json(
            {
                "id": "chatcmpl-instant",
                "object": "chat.completion",
                "created": created,
                "model": alias,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Hello from the instant upstream."},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15},
            }
        )
        self.completion_body = _json(
            {
                "id": "cmpl-instant",
                "object": "text_completion",
                "created": created,
                "model": alias,
                "choices": [{"index": 0, "text": "Hello.", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
            }
        )
        base = {
            "id": "chatcmpl-instant",
            "object": "chat.completion.chunk",
            "created": created,
            "model": alias,
        }
        self.chat_first = _event({**base, "choices": [_choice({"role": "assistant", "content": "tok"})]})
        self.chat_token = _event({**base, "choices": [_choice({"content": " tok"})]})
        self.chat_last = {
            reason: _event({**base, "choices": [_choice({}, reason)]}) for reason in ("stop", "length")
        }
        self.chat_base = base
        self.text_base = cbase = {
            "id": "cmpl-instant",
            "object": "text_completion",
            "created": created,
            "model": alias,
        }
        self.text_token = _event({**cbase, "choices": [{"index": 0, "text": " tok", "finish_reason": None}]})
        self.text_last = {
            reason: _event({**cbase, "choices": [{"index": 0, "text": "", "finish_reason": reason}]})
            for reason in ("stop", "length")
        }
        self.slots_body = _json([{"id": i, "n_ctx": 1024, "is_processing": False} for i in range(slots)])
        self.models_body = _json({"object": "list", "data": [{"id": alias, "object": "model", "created": 0}]})
        self.props_body = _json(
            {
                "total_slots": slots,
                "model_path": "instant",
                "build_info": "instant-upstream",
                "chat_template": "",
            }
        )


_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


def token_vector(token: int) -> list[float]:
    """The instant engine's vector for one token (8 wide, not normalised)."""
    return [1.0, float(token % 7), float(token % 5), float(token % 3), float(token % 2), 0.5, 0.25, 0.0]


def _tokens(text: str) -> list[int]:
    """What ``/tokenize`` answers for ``text``."""
    return list(range(max(1, len(text) // 4)))


def _mean(tokens: list[int]) -> list[float]:
    rows = [token_vector(t) for t in tokens]
    mean = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
    norm = sum(x * x for x in mean) ** 0.5 or 1.0
    return [x / norm for x in mean]


def _inputs(value: Any) -> list[list[int]]:
    """OpenAI's ``input`` (or ``content``) as token lists."""
    if isinstance(value, str):
        return [_tokens(value)]
    if value and all(isinstance(x, int) for x in value):
        return [list(value)]
    return [_tokens(x) if isinstance(x, str) else list(x) for x in value]


def rerank_score(query: str, document: str) -> float:
    """The instant reranker's score: the query's words found in the document, less a
    thousandth per word of the document (so a shorter match ranks first)."""
    words = document.lower().split()
    return float(len(set(query.lower().split()) & set(words))) - 0.001 * len(words)


_NOT_OAI = b'{"error":{"code":400,"message":"Pooling type \'none\' is not OAI compatible"}}'


def _vectors(up: Upstream, path: bytes, doc: dict[str, Any]) -> tuple[int, bytes] | None:
    """The embeddings and rerank routes, as llama.cpp serves them for its flags; None: not one."""
    if path in (b"/v1/rerank", b"/rerank", b"/v1/reranking", b"/reranking"):
        if up.pooling != "rank":
            return 501, b'{"error":{"code":501,"message":"This server does not support reranking."}}'
        docs, query = doc.get("documents") or [], str(doc.get("query", ""))
        # In reverse order: the gateway sorts.
        results = [{"index": i, "relevance_score": rerank_score(query, d)} for i, d in enumerate(docs)][::-1]
        n = sum(len(str(d).split()) + len(query.split()) for d in docs)
        return 200, _json({"results": results, "usage": {"prompt_tokens": n, "total_tokens": n}})
    if path not in (b"/v1/embeddings", b"/embeddings"):
        return None
    if up.pooling in (None, "rank"):
        return 501, b'{"error":{"code":501,"message":"This server does not support embeddings."}}'
    inputs = _inputs(doc.get("input", doc.get("content", "")))
    if path == b"/embeddings" and up.pooling == "none":
        rows = [{"index": i, "embedding": [token_vector(t) for t in toks]} for i, toks in enumerate(inputs)]
        return 200, _json(rows)
    if up.pooling == "none":
        return 400, _NOT_OAI
    data = [{"object": "embedding", "index": i, "embedding": _mean(t)} for i, t in enumerate(inputs)]
    n = sum(len(t) for t in inputs)
    return 200, _json({"object": "list", "data": data, "usage": {"prompt_tokens": n, "total_tokens": n}})


def _pieces(text: str) -> list[str]:
    """Token-like pieces (a word or one sign, with the spaces before it); they join to ``text``."""
    return _PIECE.findall(text)


def _instance(schema: Any) -> Any:
    """A small value that ``schema`` accepts: what constrained decoding would produce, minus
    the model's choices (first alternative, first enum value, every declared property)."""
    if not isinstance(schema, dict):
        return None
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if schema.get(key):
            return schema[key][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {name: _instance(sub) for name, sub in props.items()}
    if kind == "array":
        return [_instance(schema["items"])] * int(schema.get("minItems", 0)) if "items" in schema else []
    return {"string": "text", "integer": 1, "number": 1.5, "boolean": True}.get(str(kind))


def _constrained(doc: dict[str, Any], reply: str | None = None) -> str | None:
    """The answer a JSON-schema ``response_format`` forces, as compact JSON; None without one."""
    fmt = doc.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema") or {}
    schema = spec.get("schema", spec) if isinstance(spec, dict) else {}
    chosen = _fitting(schema, reply) if reply is not None and isinstance(schema, dict) else None
    return json.dumps(_instance(schema) if chosen is None else chosen, separators=(",", ":"))


def _fitting(schema: dict[str, Any], reply: str) -> Any:
    """The value of the alternative of ``schema`` that ``reply`` means, or None."""
    alternatives = [a for a in schema.get("anyOf") or [schema] if isinstance(a, dict)]
    try:
        value = json.loads(reply)
    except ValueError:
        value = None
    for alt in alternatives:
        props = alt.get("properties") or {}
        consts = {k: sub["const"] for k, sub in props.items() if isinstance(sub, dict) and "const" in sub}
        if isinstance(value, dict) and consts and set(value) == set(props):
            if all(value[k] == v for k, v in consts.items()):
                return value
    for alt in alternatives:
        props = alt.get("properties") or {}
        if len(props) == 1 and next(iter(props.values())).get("type") == "string":
            return {next(iter(props)): reply}
    return None


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish}


def _event(obj: Any) -> bytes:
    return b"data: " + _json(obj) + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: int, content_type: bytes, length: int | None, close: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Error")), b"Content-Type: " + content_type]
    lines.append(b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length)
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Connection(asyncio.Protocol):
    """One keep-alive client connection; requests are answered in order."""

    def __init__(self, upstream: Upstream) -> None:
        self.up = upstream
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy: asyncio.Task[None] | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.busy is not None:
            self.busy.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.busy is None:
            self._drain()

    def _drain(self) -> None:
        while not self.closing and self.busy is None:
            request = self._parse()
            if request is None:
                return
            method, path, body, close = request
            stream = self._answer(method, path, body, close)
            if stream is not None:
                self.busy = asyncio.ensure_future(stream)
                self.busy.add_done_callback(self._stream_done)

    def _stream_done(self, task: asyncio.Task[None]) -> None:
        self.busy = None
        if not task.cancelled() and task.exception() is not None:
            self._close()
        elif not self.closing:
            self._drain()

    def _parse(self) -> tuple[bytes, bytes, bytes, bool] | None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > _MAX_HEAD:
                self._close()
            return None
        head = bytes(self.buf[:end]).split(b"\r\n")
        try:
            method, target, version = head[0].split(b" ", 2)
        except ValueError:
            self._close()
            return None
        length, chunked = 0, False
        close = version == b"HTTP/1.0"
        for line in head[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower() or (close and b"keep-alive" not in value.lower())
        start = end + 4
        if chunked:
            parsed = _dechunk(self.buf, start)
            if parsed is None:
                return None
            body, stop = parsed
        else:
            if len(self.buf) < start + length:
                return None
            body, stop = bytes(self.buf[start : start + length]), start + length
        del self.buf[:stop]
        return method, target.split(b"?", 1)[0], body, close

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            self.transport.write(data)

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _reply(
        self, status: int, body: bytes, close: bool, content_type: bytes = b"application/json"
    ) -> None:
        self._send(_head(status, content_type, len(body), close) + body)
        if close:
            self._close()

    def _answer(self, method: bytes, path: bytes, body: bytes, close: bool) -> Any:
        up = self.up
        if method == b"GET":
            if path == b"/health":
                self._reply(200, b'{"status":"ok"}', close)
            elif path == b"/slots":
                self._reply(200, up.slots_body, close)
            elif path in (b"/v1/models", b"/models"):
                self._reply(200, up.models_body, close)
            elif path == b"/props":
                self._reply(200, up.props_body, close)
            elif path == b"/metrics":
                self._reply(200, b"# instant upstream\n", close, b"text/plain")
            else:
                self._reply(404, b'{"error":{"code":404,"message":"not found"}}', close)
            return None
        if method != b"POST":
            self._reply(405, b'{"error":{"code":405,"message":"method not allowed"}}', close)
            return None
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            self._reply(400, b'{"error":{"code":400,"message":"bad json"}}', close)
            return None
        if path in (b"/v1/chat/completions", b"/chat/completions", b"/v1/completions", b"/completions"):
            chat = b"chat" in path
            text = (_constrained(doc, up.reply) if chat else None) or up.reply
            if text is not None:
                return self._answer_text(doc, chat, text, close)
            if not doc.get("stream"):
                whole = up.chat_body if chat else up.completion_body
                if "bench_interval_ms" in doc:  # decode the answer's chunks before replying
                    n = doc.get("max_tokens") or doc.get("n_predict") or up.chunks
                    return self._reply_later(float(doc["bench_interval_ms"]) * int(n), whole, close)
                self._reply(200, whole, close)
                return None
            n = doc.get("max_tokens") or doc.get("n_predict") or up.chunks
            interval_ms = float(doc.get("bench_interval_ms", up.interval_ms))
            usage = bool((doc.get("stream_options") or {}).get("include_usage"))
            return self._stream(chat, int(n), interval_ms, usage, close)
        if (answer := _vectors(up, path, doc)) is not None:
            self._reply(*answer, close)
        elif path == b"/tokenize":
            self._reply(200, _json({"tokens": _tokens(str(doc.get("content", "")))}), close)
        elif path == b"/detokenize":
            self._reply(200, b'{"content":"tok"}', close)
        elif path == b"/apply-template":
            prompt = "\n".join(str(m.get("content", "")) for m in doc.get("messages") or [])
            self._reply(200, _json({"prompt": prompt}), close)
        else:
            self._reply(404, b'{"error":{"code":404,"message":"not found"}}', close)
        return None

    async def _reply_later(self, delay_ms: float, body: bytes, close: bool) -> None:
        """A whole answer after ``delay_ms``, as an engine decoding it would; a connection
        closed meanwhile cancels it (``connection_lost``), as an engine that stops would."""
        await asyncio.sleep(delay_ms / 1000.0)
        self._reply(200, body, close)

    def _answer_text(self, doc: dict[str, Any], chat: bool, text: str, close: bool) -> Any:
        """Answer with ``text``, cut to ``max_tokens`` pieces; a coroutine when streamed."""
        pieces = _pieces(text)
        limit = doc.get("max_tokens") or doc.get("max_completion_tokens") or doc.get("n_predict")
        finish = "stop"
        if isinstance(limit, int) and 0 < limit < len(pieces):
            pieces, finish = pieces[:limit], "length"
        usage = {"prompt_tokens": 8, "completion_tokens": len(pieces), "total_tokens": 8 + len(pieces)}
        base = self.up.chat_base if chat else self.up.text_base
        if not doc.get("stream"):
            answer = "".join(pieces)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": answer}}
            else:
                choice = {"index": 0, "text": answer}
            obj = "chat.completion" if chat else "text_completion"
            body = {**base, "object": obj, "choices": [choice | {"finish_reason": finish}], "usage": usage}
            self._reply(200, _json(body), close)
            return None
        include_usage = bool((doc.get("stream_options") or {}).get("include_usage"))
        interval_ms = float(doc.get("bench_interval_ms", self.up.interval_ms))
        return self._stream_text(
            base, chat, pieces, finish, usage if include_usage else None, interval_ms, close
        )

    async def _stream_text(
        self,
        base: dict[str, Any],
        chat: bool,
        pieces: list[str],
        finish: str,
        usage: dict[str, int] | None,
        interval_ms: float,
        close: bool,
    ) -> None:
        self._send(_head(200, b"text/event-stream", None, close))
        for i, piece in enumerate(pieces):
            if interval_ms:
                await asyncio.sleep(interval_ms / 1000.0)
            if chat:
                delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
                event = _event({**base, "choices": [_choice(delta)]})
            else:
                event = _event({**base, "choices": [{"index": 0, "text": piece, "finish_reason": None}]})
            self._send(_chunk(event))
            if not interval_ms and i % 8 == 7:
                await asyncio.sleep(0)  # let other connections in
        if chat:
            tail = _event({**base, "choices": [_choice({}, finish)]})
        else:
            tail = _event({**base, "choices": [{"index": 0, "text": "", "finish_reason": finish}]})
        if usage is not None:
            tail += _event({**base, "choices": [], "usage": usage})
        self._send(_chunk(tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        if close:
            self._close()

    async def _stream(self, chat: bool, n: int, interval_ms: float, usage: bool, close: bool) -> None:
        up = self.up
        self._send(_head(200, b"text/event-stream", None, close))
        pause_s = interval_ms / 1000.0
        for i in range(n):
            if pause_s:
                await asyncio.sleep(pause_s)
            if chat:
                self._send(_chunk(up.chat_first if i == 0 else up.chat_token))
            else:
                self._send(_chunk(up.text_token))
            if not pause_s and i % 8 == 7:
                await asyncio.sleep(0)  # let other connections in
        tail = (up.chat_last if chat else up.text_last)["length"]
        if usage:
            tail += _event(
                {
                    **up.chat_base,
                    "choices": [],
                    "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
                }
            )
        self._send(_chunk(tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        if close:
            self._close()


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n", pos)
            while end > pos:  # trailers
                pos = end + 2
                end = buf.find(b"\r\n", pos)
            if end < 0:
                return None
            return bytes(out), end + 2
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="instant_upstream", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-a", "--alias", default="instant")
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument(
        "--chunks", type=int, default=32, help="stream chunks when the request names no max_tokens"
    )
    p.add_argument("--interval-ms", type=float, default=0.0, help="pause before each stream chunk")
    p.add_argument("--reply", default=None, help="the text of every answer (default: fixed bench answers)")
    p.add_argument("--list-devices", action="store_true", help="list no GPU devices and exit")
    p.add_argument("--embeddings", "--embedding", action="store_true")
    p.add_argument("--pooling", default=None)
    p.add_argument("--reranking", "--rerank", action="store_true")
    p.add_argument(
        "--version", action="store_true", help="print a version line as llama-server does, and exit"
    )
    ns, _ = p.parse_known_args(list(argv))  # llama-server's other flags are accepted and ignored
    return ns


async def serve(ns: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    pooling = "rank" if ns.reranking else (ns.pooling or "mean") if ns.embeddings else None
    upstream = Upstream(ns.alias, ns.parallel, ns.chunks, ns.interval_ms, ns.reply, pooling)
    server = await loop.create_server(lambda: Connection(upstream), ns.host, ns.port, backlog=1024)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY http://{ns.host}:{ns.port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if ns.version:  # llama-server writes its version on stderr
        print("version: 0 (instant)", file=sys.stderr, flush=True)
        return 0
    if ns.list_devices:
        # What a CPU-only llama-server prints: the daemon asks before each load for a GPU backend.
        print("Available devices:", flush=True)
        return 0
    try:
        asyncio.run(serve(ns))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
