"""The routes beyond chat, relayed to a peer: daemon A has no model, its peer P has the test
model, the synthetic reranker and both speech models. Embeddings (OpenAI's and Ollama's),
reranking, speech and its transcription (a multipart upload, ``remote:P/MODEL`` rewritten
inside the form) asked of A are answered by P, with the official clients where one exists."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import faster_whisper  # noqa: F401  (installed by make install: missing, the tests fail)
import httpx
import ollama
import openai
import piper  # noqa: F401  (installed by make install: missing, the tests fail)
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, add_key, make_home, pull_speech, start_daemon, wait_until
from tests.synthetic_reranker import cached_reranker

pytestmark = pytest.mark.slow


RERANKER = "tiny-reranker"
SAID = "The quick brown fox jumps over the lazy dog."


class Pair:
    def __init__(self, a: DaemonProc, p: DaemonProc) -> None:
        self.a, self.p = a, p

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.a.url}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("federation-routes")
    p_home = make_home(root / "p", model_path, config="slots = 1\ndefault_ctx = 1024\n")
    Store(p_home / "models").import_file(cached_reranker(), RERANKER, source="test")
    pull_speech(p_home)
    key = add_key(p_home, "peer-a")
    p = start_daemon(p_home)
    a_home = root / "a"
    a_home.mkdir()
    (a_home / "config.toml").write_text(
        f'[[remotes]]\nname = "p"\nurl = "{p.url}"\nkey = "{key}"\npoll_s = 0.5\n'
    )
    a = start_daemon(a_home)
    try:
        peers = lambda: httpx.get(f"{a.url}/api/peers", timeout=30).json()["peers"]  # noqa: E731
        wait_until(lambda: peers()[0]["state"] == "up", what="P up")
        yield Pair(a, p)
    finally:
        a.stop()
        p.stop()


def test_embeddings_are_served_by_the_peer_in_both_dialects(pair: Pair) -> None:
    raw = pair.oai().embeddings.with_raw_response.create(model=MODEL, input=["hello world", "the cat"])
    assert raw.headers["x-blazar-peer"] == "p"
    vectors = raw.parse()
    assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) == 576
    oll = ollama.Client(host=pair.a.url, timeout=180)
    embedded = oll.embed(model=MODEL, input="hello world")
    assert len(embedded.embeddings) == 1 and len(embedded.embeddings[0]) == 576
    legacy = httpx.post(f"{pair.a.url}/api/embeddings", json={"model": MODEL, "prompt": "hi"}, timeout=180)
    assert legacy.status_code == 200 and len(legacy.json()["embedding"]) == 576


def test_reranking_is_served_by_the_peer(pair: Pair) -> None:
    docs = ["the cat sat on the mat", "a blue sky", "cat"]
    r = httpx.post(
        f"{pair.a.url}/v1/rerank",
        json={"model": RERANKER, "query": "the cat", "documents": docs},
        timeout=180,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-peer"] == "p"
    scores = [x["relevance_score"] for x in r.json()["results"]]
    assert sorted(x["index"] for x in r.json()["results"]) == [0, 1, 2] and scores == sorted(
        scores, reverse=True
    )
    o = httpx.post(
        f"{pair.a.url}/api/rerank", json={"model": RERANKER, "query": "cat", "documents": docs}, timeout=180
    )
    assert o.status_code == 200 and o.headers["x-blazar-peer"] == "p"


def test_speech_and_a_transcription_upload_are_relayed(pair: Pair) -> None:
    client = pair.oai()
    with client.audio.speech.with_streaming_response.create(
        model="piper-joe-us", voice="piper-joe-us", input=SAID, response_format="wav"
    ) as r:
        assert r.headers["x-blazar-peer"] == "p" and r.headers["content-type"].startswith("audio/")
        spoken = r.read()
    # named remote:p/…: the form's model field is rewritten for the peer, the upload kept
    raw = client.audio.transcriptions.with_raw_response.create(
        model="remote:p/whisper-tiny.en", file=("fox.wav", spoken, "audio/wav")
    )
    assert raw.headers["x-blazar-peer"] == "p"
    heard = set(re.findall(r"[a-z]+", raw.parse().text.lower()))
    assert len(heard & set(re.findall(r"[a-z]+", SAID.lower()))) >= 6, heard


def test_a_model_no_machine_has_is_still_not_found(pair: Pair) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        pair.oai().embeddings.create(model="no-such-embedder", input="x")
    assert e.value.body["blazar_code"] == "MODEL_NOT_FOUND"  # type: ignore[index]
