"""llama.cpp's utility routes through the daemon: /tokenize, /detokenize, /apply-template and
/infill, with the model named in the body, on the real engine. /infill runs on a copy of the
test model whose header names FIM tokens (``tests.synthetic_fim``) and is refused on the
test model itself, which has none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, make_home, start_daemon
from tests.synthetic_fim import cached_fim_model

pytestmark = pytest.mark.slow

FIM = "smollm2-fim"
PINNED = "smollm2-pinned"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    config = f'slots = 1\ndefault_ctx = 512\n[models."{PINNED}"]\nengine = "mistralrs"\n'
    home = make_home(tmp_path_factory.mktemp("utilities") / "home", model_path, config=config)
    store = Store(home / "models")
    store.import_file(cached_fim_model(model_path), FIM, source="test")
    store.import_file(model_path, PINNED, source="test")
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


def _post(d: DaemonProc, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{d.url}{path}", json=body, timeout=120)


def test_tokenize_detokenize_and_the_template_come_from_the_models_engine(daemon: DaemonProc) -> None:
    tokens = _post(daemon, "/tokenize", {"model": MODEL, "content": "Hello there", "with_pieces": True})
    assert tokens.status_code == 200, tokens.text
    pieces = tokens.json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello there" and all(
        isinstance(p["id"], int) for p in pieces
    )
    back = _post(daemon, "/detokenize", {"model": MODEL, "tokens": [p["id"] for p in pieces]})
    assert back.status_code == 200 and back.json()["content"].strip() == "Hello there"
    prompt = _post(
        daemon, "/apply-template", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert prompt.status_code == 200, prompt.text
    assert "<|im_start|>user\nHi<|im_end|>" in prompt.json()["prompt"]


def test_infill_runs_where_the_vocabulary_has_the_tokens(daemon: DaemonProc) -> None:
    body = {"model": FIM, "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n    return c\n",
            "n_predict": 6, "temperature": 0}  # fmt: skip
    whole = _post(daemon, "/infill", body)
    assert whole.status_code == 200, whole.text
    doc = whole.json()
    assert doc["tokens_predicted"] > 0 and isinstance(doc["content"], str)
    with httpx.stream("POST", f"{daemon.url}/infill", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert len(events) >= 2 and '"stop":true' in events[-1].replace(" ", "")


def test_infill_is_refused_where_it_cannot_run(daemon: DaemonProc) -> None:
    none = _post(daemon, "/infill", {"model": MODEL, "input_prefix": "a", "input_suffix": "b"})
    assert none.status_code == 400, none.text
    err = none.json()["error"]
    assert err["blazar_code"] == "MODEL_CANNOT_INFILL" and "fill in the middle" in err["message"]
    other = _post(daemon, "/tokenize", {"model": PINNED, "content": "x"})
    assert other.status_code == 400 and other.json()["error"]["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
    assert "mistral.rs" in other.json()["error"]["message"]


def test_ollama_generate_with_suffix_fills_in_the_middle(daemon: DaemonProc) -> None:
    oll = ollama.Client(host=daemon.url, timeout=120)
    ask = {"model": FIM, "prompt": "def add(a, b):\n    ", "suffix": "\n    return c\n"}
    whole = oll.generate(**ask, options={"num_predict": 6, "temperature": 0})  # type: ignore[arg-type]
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count is not None and 0 < whole.eval_count <= 6
    assert whole.prompt_eval_count is not None and whole.prompt_eval_count > 0
    parts = list(oll.generate(**ask, stream=True, options={"num_predict": 6, "temperature": 0}))  # type: ignore[arg-type]
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.response for p in parts) == whole.response  # the same greedy answer
    # the engine's own /infill lays the prompt out the same way: the same words come back
    native = {"model": FIM, "input_prefix": ask["prompt"], "input_suffix": ask["suffix"]}
    direct = _post(daemon, "/infill", {**native, "n_predict": 6, "temperature": 0})
    assert direct.status_code == 200 and direct.json()["content"] == whole.response


def test_ollama_suffix_is_refused_where_it_cannot_run(daemon: DaemonProc) -> None:
    oll = ollama.Client(host=daemon.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as info:
        oll.generate(model=MODEL, prompt="a", suffix="b", options={"num_predict": 2})
    assert info.value.status_code == 400 and "fill in the middle" in info.value.error
    body = {"model": MODEL, "prompt": "a", "suffix": "b", "stream": False}
    raw = httpx.post(f"{daemon.url}/api/generate", json=body, timeout=60)
    assert raw.status_code == 400 and raw.json()["blazar_code"] == "MODEL_CANNOT_INFILL"
    with pytest.raises(ollama.ResponseError) as info:
        oll.generate(model=PINNED, prompt="a", suffix="b")
    assert info.value.status_code == 400 and "mistral.rs" in info.value.error


def test_bad_bodies_are_answered_before_any_engine(daemon: DaemonProc) -> None:
    missing = _post(daemon, "/tokenize", {"content": "x"})
    assert missing.status_code == 400 and "`model`" in missing.json()["error"]["message"]
    unknown = _post(daemon, "/detokenize", {"model": "no-such-model", "tokens": [1]})
    assert unknown.status_code == 404 and unknown.json()["error"]["blazar_code"] == "MODEL_NOT_FOUND"
    broken = httpx.post(f"{daemon.url}/apply-template", content=b"{not json", timeout=30)
    assert broken.status_code == 400 and broken.json()["error"]["blazar_code"] == "INVALID_JSON"
    assert httpx.get(f"{daemon.url}/health", timeout=10).status_code == 200
