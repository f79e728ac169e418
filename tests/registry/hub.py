"""A local stand-in for the Hugging Face Hub and the Ollama registry, served over real HTTP.

`Hub` runs a `ThreadingHTTPServer` on 127.0.0.1 in a background thread and serves:

Hugging Face (what huggingface_hub and our downloader call)
    GET  /api/models?search=…&limit=N                 the listing `blazar search` reads
    GET  /api/models/{org}/{repo}[/revision/{rev}]   model info; `?blobs=true` adds sizes + lfs
    GET  /api/models/{org}/{repo}/tree/{rev}[/{dir}]  file listing (list_repo_files)
    POST /api/models/{org}/{repo}/paths-info/{rev}    get_paths_info
    HEAD/GET /{org}/{repo}/resolve/{rev}/{file}       the bytes, with ETag, X-Linked-Size,
                                                     X-Linked-Etag, X-Repo-Commit and Range

Ollama registry
    GET  /v2/{ns}/{name}/manifests/{tag}
    HEAD/GET /v2/{ns}/{name}/blobs/sha256:{hex}      (optionally a 307 to /_cdn/, as the real one)

Fault injection: `Hub.fault(match, ...)` answers a status (404/401/429 + Retry-After…), drops
the connection at a file offset, flips bytes, or holds the response at an offset until
released or until the client goes away. Every byte range of content actually written to a
socket is recorded per sha256, so a test can check that each byte went out once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Fault", "Hub", "Logged", "open_hub"]

_CHUNK = 64 * 1024
_HOLD_LIMIT_S = 30.0
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")

MODEL_MEDIA = "application/vnd.ollama.image.model"
PROJECTOR_MEDIA = "application/vnd.ollama.image.projector"
TEMPLATE_MEDIA = "application/vnd.ollama.image.template"
SYSTEM_MEDIA = "application/vnd.ollama.image.system"
PARAMS_MEDIA = "application/vnd.ollama.image.params"
LICENSE_MEDIA = "application/vnd.ollama.image.license"


@dataclass
class Fault:
    """One injected misbehaviour, applied to requests whose path contains `match`."""

    match: str
    status: int | None = None
    """Answer this HTTP status (with a small JSON body) instead of the content."""
    retry_after: str | None = None
    error_code: str | None = None
    """Sent as X-Error-Code, which huggingface_hub reads (RepoNotFound, EntryNotFound, GatedRepo…)."""
    drop_at: int | None = None
    """Close the connection once the file offset reaches this many bytes."""
    corrupt: tuple[int, ...] = ()
    """File offsets whose byte is flipped on the way out."""
    hold_at: int | None = None
    """Stop at this file offset until `release` is set (then go on) or the client leaves (then close)."""
    times: int | None = 1
    """How many requests this fault applies to; None means every request."""
    methods: tuple[str, ...] = ("GET", "HEAD", "POST")
    hits: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def active(self) -> bool:
        return self.times is None or self.hits < self.times


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class _Content:
    sha256: str
    size: int
    data: bytes | None = None
    path: Path | None = None

    def read(self, start: int, end: int) -> Iterator[bytes]:
        if self.data is not None:
            for pos in range(start, end, _CHUNK):
                yield self.data[pos : min(end, pos + _CHUNK)]
            return
        assert self.path is not None
        with open(self.path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < end:
                chunk = f.read(min(_CHUNK, end - pos))
                if not chunk:
                    return
                pos += len(chunk)
                yield chunk


@dataclass
class _RepoFile:
    name: str
    content: _Content
    lfs: bool

    @property
    def blob_id(self) -> str:
        return hashlib.sha1(f"blob {self.name} {self.content.sha256}".encode()).hexdigest()


@dataclass
class _Repo:
    repo: str
    commit: str
    token: str | None = None
    files: dict[str, _RepoFile] = field(default_factory=dict)


def _sha256_of(data: bytes | Path) -> tuple[str, int]:
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest(), len(data)
    digest = hashlib.sha256()
    with open(data, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest(), data.stat().st_size


class Hub:
    """The test hub; use `open_hub()` (or `start()`/`close()`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contents: dict[str, _Content] = {}
        self._repos: dict[str, _Repo] = {}
        self._ollama: dict[tuple[str, str, str], bytes] = {}
        self.faults: list[Fault] = []
        self.log: list[Logged] = []
        self.served: dict[str, list[tuple[int, int]]] = {}
        self.redirect_ollama_blobs = True
        """Answer Ollama blob GETs with a 307 to /_cdn/ (the real registry redirects to a CDN)."""
        self.redirect_hf_downloads = False
        """Answer LFS resolve GETs with a 302 to /_cdn/ (huggingface.co does, to its CDN)."""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the hub is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Hub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="test-hub", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        for fault in self.faults:
            fault.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- content ---------------------------------------------------------

    def _content(self, data: bytes | Path) -> _Content:
        sha, size = _sha256_of(data)
        with self._lock:
            if sha not in self._contents:
                if isinstance(data, bytes):
                    self._contents[sha] = _Content(sha256=sha, size=size, data=data)
                else:
                    self._contents[sha] = _Content(sha256=sha, size=size, path=Path(data))
            return self._contents[sha]

    def add_hf_file(
        self, repo: str, filename: str, data: bytes | Path, *, lfs: bool = True, token: str | None = None
    ) -> str:
        """Publish `data` as `repo`/`filename`; returns its sha256. `token` makes the repo private."""
        content = self._content(data)
        with self._lock:
            entry = self._repos.get(repo)
            if entry is None:
                commit = hashlib.sha1(repo.encode()).hexdigest()
                entry = self._repos[repo] = _Repo(repo=repo, commit=commit)
            if token is not None:
                entry.token = token
            entry.files[filename] = _RepoFile(name=filename, content=content, lfs=lfs)
        return content.sha256

    def hf_commit(self, repo: str) -> str:
        return self._repos[repo].commit

    def add_ollama_model(
        self, name: str, tag: str, layers: list[tuple[str, bytes | Path]], *, namespace: str = "library"
    ) -> dict[str, Any]:
        """Publish a manifest whose layers are `(media type, content)`; returns the manifest."""
        manifest_layers = []
        for media, data in layers:
            content = self._content(data)
            manifest_layers.append(
                {"mediaType": media, "digest": f"sha256:{content.sha256}", "size": content.size}
            )
        config = json.dumps({"model_format": "gguf", "model_family": "llama", "os": "linux"}).encode()
        config_content = self._content(config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": f"sha256:{config_content.sha256}",
                "size": config_content.size,
            },
            "layers": manifest_layers,
        }
        with self._lock:
            self._ollama[(namespace, name, tag)] = json.dumps(manifest).encode()
        return manifest

    # -- faults and records ----------------------------------------------

    def fault(self, match: str, **kwargs: Any) -> Fault:
        fault = Fault(match=match, **kwargs)
        with self._lock:
            self.faults.append(fault)
        return fault

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                # A fault about the bytes (no status) waits for the GET that carries them.
                content_only = fault.status is None and method != "GET"
                if fault.match in path and method in fault.methods and fault.active() and not content_only:
                    fault.hits += 1
                    return fault
        return None

    def _record(self, sha: str, start: int, end: int) -> None:
        if end > start:
            with self._lock:
                self.served.setdefault(sha, []).append((start, end))

    def ranges(self, sha: str) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(self.served.get(sha, []))

    def bytes_served(self, sha: str) -> int:
        return sum(end - start for start, end in self.ranges(sha))

    def requests(self, contains: str = "", method: str | None = None) -> list[Logged]:
        with self._lock:
            return [r for r in self.log if contains in r.path and (method is None or r.method == method)]


@contextlib.contextmanager
def open_hub() -> Iterator[Hub]:
    hub = Hub().start()
    try:
        yield hub
    finally:
        hub.close()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"  # keep-alive, as the real hub; every answer has a Content-Length

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ----------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        hub = self.hub
        with hub._lock:
            hub.log.append(Logged(method, path, self.headers.get("Range"), self.headers.get("Authorization")))
        body = b""
        if method == "POST":
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = hub._take_fault(method, path)
        if fault is not None and fault.status is not None:
            headers = {"X-Error-Code": fault.error_code} if fault.error_code else {}
            if fault.retry_after is not None:
                headers["Retry-After"] = fault.retry_after
            self._json(fault.status, {"error": f"injected {fault.status}"}, headers)
            return
        try:
            if path == "/api/models":
                self._hf_list(query)
            elif path.startswith("/api/models/"):
                self._hf_api(method, path.removeprefix("/api/models/"), query, body)
            elif path.startswith("/v2/"):
                self._ollama(method, path.removeprefix("/v2/"), fault)
            elif path.startswith("/_cdn/"):
                self._cdn(method, path.removeprefix("/_cdn/"), fault)
            elif "/resolve/" in path:
                self._resolve(method, path.lstrip("/"), fault)
            else:
                self._json(404, {"error": "not found"})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _redirect(self, status: int, location: str) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _authorized(self, repo: _Repo) -> bool:
        return repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}"

    def _repo_or_error(self, repo_id: str) -> _Repo | None:
        repo = self.hub._repos.get(repo_id)
        if repo is None:
            self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return None
        if not self._authorized(repo):
            # As huggingface.co: a private repo looks missing to a caller without a token.
            self._json(
                401,
                {"error": "Invalid username or password."},
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Invalid username or password."},
            )
            return None
        return repo

    def _check_revision(self, repo: _Repo, revision: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self._json(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
        return False

    # -- Hugging Face ------------------------------------------------------

    def _hf_list(self, query: dict[str, list[str]]) -> None:
        """The model listing `blazar search` reads: public repos matching ``search``, most
        downloaded first (downloads here: the number of files, likes: fixed)."""
        words = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["20"])[0])
        found = [
            {"id": r.repo, "downloads": 1000 * len(r.files), "likes": 7, "tags": ["gguf"]}
            for r in self.hub._repos.values()
            if r.token is None and words in r.repo.lower()
        ]
        found.sort(key=lambda m: -m["downloads"])
        self._json(200, found[:limit])

    def _hf_api(self, method: str, rest: str, query: dict[str, list[str]], body: bytes) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        repo = self._repo_or_error(repo_id)
        if repo is None:
            return
        if not tail or (tail[0] == "revision" and len(tail) >= 2):
            revision = "/".join(tail[1:]) if tail else "main"
            if not self._check_revision(repo, revision):
                return
            blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
            self._json(200, self._model_info(repo, blobs=blobs))
        elif tail[0] == "tree" and len(tail) >= 2:
            if not self._check_revision(repo, tail[1]):
                return
            folder = "/".join(tail[2:])
            files = [f for name, f in sorted(repo.files.items()) if name.startswith(folder)]
            self._json(200, [self._tree_entry(f) for f in files])
        elif tail[0] == "paths-info" and len(tail) >= 2 and method == "POST":
            if not self._check_revision(repo, tail[1]):
                return
            form = parse_qs(body.decode())
            if not form and body.startswith(b"{"):
                form = {"paths": json.loads(body).get("paths", [])}
            wanted = form.get("paths", [])
            self._json(200, [self._tree_entry(repo.files[p]) for p in wanted if p in repo.files])
        else:
            self._json(404, {"error": "not found"})

    def _model_info(self, repo: _Repo, *, blobs: bool) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = []
        for name, f in sorted(repo.files.items()):
            sibling: dict[str, Any] = {"rfilename": name}
            if blobs:
                sibling["size"] = f.content.size
                sibling["blobId"] = f.blob_id
                if f.lfs:
                    sibling["lfs"] = {"sha256": f.content.sha256, "size": f.content.size, "pointerSize": 134}
            siblings.append(sibling)
        return {
            "_id": repo.commit[:24],
            "id": repo.repo,
            "modelId": repo.repo,
            "author": repo.repo.split("/")[0],
            "sha": repo.commit,
            "private": repo.token is not None,
            "gated": False,
            "disabled": False,
            "tags": ["gguf"],
            "library_name": "gguf",
            "siblings": siblings,
        }

    @staticmethod
    def _tree_entry(f: _RepoFile) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.content.size, "path": f.name}
        if f.lfs:
            entry["lfs"] = {"oid": f.content.sha256, "size": f.content.size, "pointerSize": 134}
        return entry

    def _resolve(self, method: str, rest: str, fault: Fault | None) -> None:
        before, _, after = rest.partition("/resolve/")
        repo = self._repo_or_error(before)
        if repo is None:
            return
        revision, _, filename = after.partition("/")
        if not self._check_revision(repo, revision):
            return
        f = repo.files.get(filename)
        if f is None:
            self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            return
        etag = f.content.sha256 if f.lfs else f.blob_id
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": repo.commit}
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.content.sha256}"'
            headers["X-Linked-Size"] = str(f.content.size)
        if f.lfs and method == "GET" and self.hub.redirect_hf_downloads:
            self.send_response(302)
            self.send_header("Location", f"/_cdn/sha256:{f.content.sha256}")
            self.send_header("Content-Length", "0")
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            return
        self._send_content(method, f.content, fault, headers)

    # -- Ollama ------------------------------------------------------------

    def _ollama(self, method: str, rest: str, fault: Fault | None) -> None:
        m = re.fullmatch(r"(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)", rest)
        if m is None:
            self._json(404, {"errors": [{"code": "NAME_UNKNOWN"}]})
            return
        namespace, _, name = m["repo"].rpartition("/")
        if m["kind"] == "manifests":
            manifest = self.hub._ollama.get((namespace, name, m["ref"]))
            if manifest is None:
                self._json(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
            self.send_header("Content-Length", str(len(manifest)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(manifest)
            return
        digest = m["ref"]
        content = self.hub._contents.get(digest.removeprefix("sha256:"))
        if content is None:
            self._json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
            return
        if method == "GET" and self.hub.redirect_ollama_blobs:
            self._redirect(307, f"/_cdn/{digest}")
            return
        self._send_content(method, content, fault, {"Docker-Content-Digest": digest})

    def _cdn(self, method: str, ref: str, fault: Fault | None) -> None:
        content = self.hub._contents.get(ref.removeprefix("sha256:"))
        if content is None:
            self._json(404, {"error": "no such object"})
            return
        self._send_content(method, content, fault, {"ETag": f'"{content.sha256}"'})

    # -- content with Range and faults ------------------------------------

    def _send_content(
        self, method: str, content: _Content, fault: Fault | None, headers: dict[str, str]
    ) -> None:
        size = content.size
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted:
            m = _RANGE.match(wanted.strip())
            if m is None or int(m[1]) >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m[1])
            end = min(size, int(m[2]) + 1) if m[2] else size
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if method == "HEAD":
            return
        pos = start
        try:
            for chunk in content.read(start, end):
                if fault is not None and fault.corrupt:
                    buf = bytearray(chunk)
                    for offset in fault.corrupt:
                        if pos <= offset < pos + len(buf):
                            buf[offset - pos] ^= 0xFF
                    chunk = bytes(buf)
                stop = pos + len(chunk)
                if fault is not None and fault.hold_at is not None and pos <= fault.hold_at < stop:
                    head = fault.hold_at - pos
                    self._write(content.sha256, pos, chunk[:head])
                    pos, chunk = fault.hold_at, chunk[head:]
                    if not self._hold(fault):
                        self._abort()
                        return
                if (
                    fault is not None
                    and fault.drop_at is not None
                    and pos <= fault.drop_at < pos + len(chunk)
                ):
                    self._write(content.sha256, pos, chunk[: fault.drop_at - pos])
                    self._abort()
                    return
                self._write(content.sha256, pos, chunk)
                pos += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _write(self, sha: str, pos: int, chunk: bytes) -> None:
        if chunk:
            self.wfile.write(chunk)
            self.hub._record(sha, pos, pos + len(chunk))

    def _hold(self, fault: Fault) -> bool:
        """Wait at the hold point; True to go on, False when the client left (or too long)."""
        self.wfile.flush()
        fault.reached.set()
        waited = 0.0
        while not fault.release.wait(0.02):
            waited += 0.02
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return False
                except OSError:
                    return False
            if waited > _HOLD_LIMIT_S:
                return False
        return True

    def _abort(self) -> None:
        """Close mid-body, so the client sees fewer bytes than Content-Length promised."""
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True
