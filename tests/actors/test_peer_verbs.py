"""The operator's verbs on a peer, run by the runtime with no gateway: ``PeerActor.warm`` and
``PeerActor.replicate`` against a fake Blazar peer (an in-process transport over a store of
its own) that answers as the daemon's routes do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import httpx
import msgspec
import numpy as np
import pytest
import trio

from actors.config import Remote
from actors.errors import PeerNotFound, PeerRefused, PeerUnavailable
from actors.peer import PeerActor
from actors.peers import Peers
from registry.replica import BlobReceiver, Replica, install, replica_of
from registry.store import Store
from tests.support import unreachable_url


def _tiny_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("Tiny")
    writer.add_context_length(256)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class FakePeer:
    """A peer daemon's routes for warm and replicate, over ``store``. Its own pull always fails
    (no network there); without ``admin`` it refuses blobs as a key without that scope is."""

    def __init__(self, store: Store, *, admin: bool = True) -> None:
        self.store = store
        self.admin = admin
        self.loaded: list[str] = []
        self.seen: list[str] = []

    def _json(self, doc: object, status: int = 200) -> httpx.Response:
        return httpx.Response(status, content=msgspec.json.encode(doc))

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        self.seen.append(f"{method} {path}")
        if path == "/api/capacity":
            installed = [{"name": r.name, "digest": r.digest} for r in self.store.list()]
            models = [{"model": m, "state": "ready"} for m in self.loaded]
            return self._json({"census": {}, "models": models, "installed": installed})
        assert request.headers.get("x-blazar-relayed-by")  # a verb: the peer never relays it on
        if path == "/api/generate":
            model = msgspec.json.decode(await request.aread())["model"]
            if self.store.find(model) is None:
                doc = {"error": f"model '{model}' not found", "blazar_code": "MODEL_NOT_FOUND"}
                return self._json(doc, 404)
            self.loaded.append(model)
            return self._json({"model": model, "done": True, "done_reason": "load"})
        if path.startswith("/admin/models/") and path.endswith("/replica"):
            record = self.store.find(path.removeprefix("/admin/models/").removesuffix("/replica"))
            if record is None:
                return self._json({"error": {"message": "not here", "blazar_code": "MODEL_NOT_FOUND"}}, 404)
            return self._json(replica_of(self.store, record))
        if path == "/api/pull":
            line = {"error": "no network here", "blazar_code": "PULL_FAILED"}
            return httpx.Response(200, content=msgspec.json.encode(line) + b"\n")
        if path.startswith("/api/blobs/"):
            digest = path.removeprefix("/api/blobs/")
            if not self.admin:
                refusal = {"message": "this key lacks the admin scope", "blazar_code": "NEW_CODE"}
                return self._json({"error": refusal}, 403)
            if method == "HEAD":
                return httpx.Response(200 if self.store.has_blob(digest) else 404)
            with BlobReceiver(self.store, digest) as receiver:
                receiver.write(await request.aread())
                receiver.finish()
            return httpx.Response(201)
        if path == "/admin/models/install":
            record = install(self.store, msgspec.json.decode(await request.aread(), type=Replica))
            return self._json({"name": record.name}, 201)
        return httpx.Response(404)


@pytest.fixture
def here(tmp_path: Path) -> Store:
    store = Store(tmp_path / "here" / "models")
    store.import_file(_tiny_gguf(tmp_path / "tiny.gguf"), "tiny")
    return store


async def _with_peer(fake: FakePeer, work: Any) -> Any:
    """Run ``work(actor)`` with a peer actor whose client reaches ``fake``."""
    actor = PeerActor("b", "http://peer-b", Remote(name="b", url="http://peer-b", poll_s=60, poll_max_s=60))
    headers = dict(actor.client.headers)
    await actor.client.aclose()
    actor.client = httpx.AsyncClient(base_url=actor.url, headers=headers, transport=httpx.MockTransport(fake))
    result: Any = None
    error: Exception | None = None
    with trio.fail_after(30):  # catches hangs only
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            try:
                result = await work(actor)
            except Exception as exc:  # raised below, outside the nursery's exception group
                error = exc
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


async def test_warm_loads_on_the_peer_and_polls_it(tmp_path: Path, here: Store) -> None:
    theirs = Store(tmp_path / "peer" / "models")
    theirs.import_file(_tiny_gguf(tmp_path / "t.gguf"), "tiny")
    fake = FakePeer(theirs)
    warmed = await _with_peer(fake, lambda a: a.warm("tiny", keep_alive="5m"))
    assert (warmed.peer, warmed.model, warmed.state) == ("b", "tiny", "ready")
    assert warmed.answer["done_reason"] == "load"


async def test_warm_of_a_model_the_peer_lacks_says_to_replicate_it(tmp_path: Path) -> None:
    fake = FakePeer(Store(tmp_path / "peer" / "models"))
    with pytest.raises(PeerRefused) as info:
        await _with_peer(fake, lambda a: a.warm("tiny"))
    assert info.value.code == "MODEL_NOT_FOUND"
    assert "peer 'b' did not load 'tiny'" in info.value.message
    assert "blazar replicate tiny --to b" in info.value.message


async def test_replicate_streams_what_the_peer_cannot_pull(tmp_path: Path, here: Store) -> None:
    theirs = Store(tmp_path / "peer" / "models")
    fake = FakePeer(theirs)
    steps: list[dict[str, Any]] = []

    async def record(fields: dict[str, Any]) -> None:
        steps.append(fields)

    done = await _with_peer(fake, lambda a: a.replicate(here, "tiny", on_progress=record))
    ours = here.get("tiny")
    assert (done.model, done.digest, done.via) == ("tiny", ours.digest, "stream")
    assert theirs.get("tiny").digest == ours.digest
    statuses = [s["status"] for s in steps]
    assert statuses[0] == "asking the peer to pull it from its own sources"
    assert statuses[1].startswith("the peer's pull failed (no network here)")
    assert "sent" in statuses and steps[-1] == {"status": "success", "via": "stream", "digest": ours.digest}
    # a second time the peer has the same files: nothing is sent
    again = await _with_peer(fake, lambda a: a.replicate(here, "tiny", from_here=True))
    assert again.via == "already there"


async def test_replicate_to_a_peer_that_refuses_blobs_keeps_its_code(tmp_path: Path, here: Store) -> None:
    fake = FakePeer(Store(tmp_path / "peer" / "models"), admin=False)
    with pytest.raises(PeerRefused) as info:
        await _with_peer(fake, lambda a: a.replicate(here, "tiny", from_here=True))
    assert (info.value.code, info.value.fallback) == ("NEW_CODE", "KEY_SCOPE_FORBIDDEN")
    assert "peer 'b' refused to receive blobs" in info.value.message and "admin scope" in info.value.message


async def test_a_peer_that_cannot_be_reached_or_is_not_configured() -> None:
    peers = Peers([Remote(name="gone", url=unreachable_url(), poll_s=60, poll_max_s=60)])
    with pytest.raises(PeerNotFound, match="no peer named 'nowhere' \\(peers: none is configured\\)"):
        peers.require("nowhere")
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run)
        with pytest.raises(PeerUnavailable, match="peer 'gone' cannot be reached"):
            await peers.require("gone").warm("tiny")
        nursery.cancel_scope.cancel()
