"""``POST /v1/systemone`` and ``blazar classify`` on the real daemon and the real test model:
label scores from the engine's own token probabilities that sum to 1, a yes or no, a number
held to its range, the constrained method, and every refusal (stream, bad bodies, a key
whose scope leaves the model out) in the OpenAI shape with its ``blazar_code``."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry.store import Store
from tests.support import MODEL, DaemonProc, add_key, make_home, start_daemon

pytestmark = pytest.mark.slow

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROUTE = "/v1/systemone"


# Two cascades whose judge is the test model under another name: one whose threshold no answer
# reaches (every step the judge reads escalates) and one every answer passes.
JUDGE = "smollm2-judge"
CONFIG = f"""slots = 1
best_of_judge = "{JUDGE}"

[[cascade]]
name = "judged-strict"
models = ["{MODEL}", "{MODEL}"]
judge = "{JUDGE}"
judge_threshold = 1.0

[[cascade]]
name = "judged-lenient"
models = ["{MODEL}", "{MODEL}"]
judge = "{JUDGE}"
judge_threshold = 0.0
"""


class Keys:
    def __init__(self, home: Path) -> None:
        self.full = add_key(home, "full", "chat,admin")
        self.other_models = add_key(home, "other-models", "chat,models:qwen*")
        self.embeddings_only = add_key(home, "embeddings-only", "embeddings")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[tuple[DaemonProc, Keys]]:
    home = make_home(tmp_path_factory.mktemp("decisions") / "home", model_path, config=CONFIG)
    Store(home / "models").import_file(model_path, JUDGE, source="test")
    keys = Keys(home)
    d = start_daemon(home)
    try:
        yield d, keys
    finally:
        d.stop()


def ledger_row(d: DaemonProc, trace: dict[str, str], auth: dict[str, str]) -> dict[str, Any]:
    """The request's ledger record, once written (the gateway records it without waiting)."""
    deadline = time.monotonic() + 10.0
    while not (rows := httpx.get(f"{d.url}/admin/requests", params=trace, headers=auth).json()["data"]):
        assert time.monotonic() < deadline, f"no ledger record for {trace}"
        time.sleep(0.05)
    (row,) = rows
    return row  # type: ignore[no-any-return]


def decide(d: DaemonProc, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{d.url}{ROUTE}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=180)


def documented_example() -> dict[str, Any]:
    """The request docs/api.md shows under ``<!-- example: /v1/systemone -->``."""
    text = API_DOC.read_text()
    found = re.search(r"<!-- example: /v1/systemone -->\n```json\n(.*?)```", text, re.DOTALL)
    assert found, "docs/api.md has no example for /v1/systemone"
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def test_the_documented_label_decision_scores_every_label_from_the_engine(
    setup: tuple[DaemonProc, Keys],
) -> None:
    d, keys = setup
    body = documented_example()
    r = decide(d, keys.full, body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "decision" and doc["kind"] == "labels" and doc["model"] == MODEL
    assert doc["id"].startswith("decision-") and doc["method"] == "logprobs"
    scores = doc["scores"]
    assert list(scores) == body["labels"]
    assert math.isclose(sum(scores.values()), 1.0, abs_tol=1e-9)
    assert all(0.0 < s < 1.0 for s in scores.values())  # probabilities, not a vote
    assert doc["label"] == max(scores, key=scores.__getitem__)
    usage = doc["usage"]
    assert usage["prompt_tokens"] > 10 and usage["completion_tokens"] >= len(body["labels"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    # Three labels, and labels whose tokens begin one another's: still one score each, summing to 1.
    for labels in (["positive", "negative", "neutral"], ["no", "none", "nothing at all"]):
        r = decide(d, keys.full, {"model": MODEL, "input": "It was an ordinary day.", "labels": labels})
        assert r.status_code == 200, r.text
        scores = r.json()["scores"]
        assert list(scores) == labels and math.isclose(sum(scores.values()), 1.0, abs_tol=1e-9)

    # The same request scores the same: the probabilities are the model's, not a sample.
    again = decide(d, keys.full, body).json()
    assert again["scores"] == pytest.approx(doc["scores"], abs=1e-6)


def test_a_yes_or_no_and_a_number_in_range(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    r = decide(
        d,
        keys.full,
        {"model": MODEL, "input": "The sky is blue.", "kind": "boolean", "question": "Is the sky blue?"},
    )
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["kind"] == "boolean" and doc["method"] == "logprobs" and isinstance(doc["value"], bool)
    assert set(doc["scores"]) == {"yes", "no"} and doc["probability"] == doc["scores"]["yes"]
    assert math.isclose(doc["scores"]["yes"] + doc["scores"]["no"], 1.0, abs_tol=1e-9)
    assert doc["value"] == (doc["probability"] >= 0.5)

    ask = {"model": MODEL, "input": "The film was fine, nothing special.", "kind": "number"}
    r = decide(d, keys.full, {**ask, "question": "Rate the review from 2 to 4.", "min": 2, "max": 4})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["kind"] == "number" and doc["method"] == "constrained"
    assert isinstance(doc["value"], int) and 2 <= doc["value"] <= 4 and "clamped" not in doc
    assert "enforced=engine-grammar" in r.headers["x-blazar-structured-output"]
    r = decide(d, keys.full, {**ask, "question": "How positive is it?", "min": 0, "max": 1, "integer": False})
    assert r.status_code == 200, r.text
    value = r.json()["value"]
    assert isinstance(value, float) and 0.0 <= value <= 1.0


def test_the_constrained_method_picks_one_label(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    labels = ["spam", "not spam"]
    body = {"model": MODEL, "input": "Win a free cruise now!!!", "labels": labels, "method": "constrained"}
    r = decide(d, keys.full, body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["method"] == "constrained" and doc["label"] in labels
    assert doc["scores"] == {label: 1.0 if label == doc["label"] else 0.0 for label in labels}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x"}, "labels", "missing field `labels`"),
        ({"input": "x", "labels": []}, "labels", "empty"),
        ({"input": "x", "labels": ["safe"]}, "labels", "at least two"),
        ({"input": "x", "labels": ["safe", "unsafe", "safe"]}, "labels", "twice"),
        ({"input": "x", "labels": ["safe", " "]}, "labels[1]", "empty"),
        ({"input": "", "labels": ["a", "b"]}, "input", "empty"),
        ({"input": "x", "kind": "boolean"}, "question", "required"),
        ({"input": "x", "kind": "number", "question": "q", "min": 5, "max": 1}, "min", "above `max`"),
        ({"input": "x", "kind": "number", "question": "q", "min": 1}, "max", "required"),
        ({"input": "x", "labels": ["a", "b"], "min": 1}, "min", "number"),
    ],
)
def test_a_bad_body_is_a_400_naming_its_field(
    setup: tuple[DaemonProc, Keys], body: dict[str, Any], param: str, words: str
) -> None:
    d, keys = setup
    r = decide(d, keys.full, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["blazar_code"] == "BAD_REQUEST" and error["param"] == param
    assert words in error["message"] and f"`{param.split('[')[0]}" in error["message"]


def test_stream_and_the_keys_scopes_are_refused(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    body = {"model": MODEL, "input": "hello", "labels": ["greeting", "question"]}
    r = decide(d, keys.full, {**body, "stream": True})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["blazar_code"] == "DECISION_NOT_STREAMED" and error["param"] == "stream"
    assert "stream" in error["message"]

    r = decide(d, keys.other_models, body)
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "MODEL_NOT_IN_SCOPE"
    r = decide(d, keys.embeddings_only, body)
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "KEY_SCOPE_FORBIDDEN"
    r = httpx.post(f"{d.url}{ROUTE}", json=body, timeout=30)
    assert r.status_code == 401

    r = decide(d, keys.full, {**body, "model": "not-installed"})
    assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "MODEL_NOT_FOUND"


def test_decisions_are_in_the_ledger_under_their_key(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    body = {"model": MODEL, "input": "I will be late today.", "labels": ["work", "family"]}
    r = decide(d, keys.full, body)
    assert r.status_code == 200
    admin = {"authorization": f"Bearer {keys.full}"}
    ledger_row(d, {"trace_id": r.headers["x-blazar-trace-id"]}, admin)  # written without waiting
    records = httpx.get(f"{d.url}/admin/requests", params={"limit": 100}, headers=admin).json()["data"]
    mine = [r for r in records if r["path"] == ROUTE and r["status"] == 200]
    assert mine, records
    assert all(r["model"] == MODEL and r["key"] == "full" for r in mine)
    assert all(r["prompt_tokens"] and r["completion_tokens"] for r in mine), mine


def test_blazar_classify_prints_the_winning_label_and_the_scores(setup: tuple[DaemonProc, Keys]) -> None:
    d, _ = setup
    done = d.cli("classify", MODEL, "Buy cheap pills online now", "--labels", "safe,unsafe", check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] in ("safe", "unsafe") and len(lines) == 3
    scores = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    assert list(scores) == ["safe", "unsafe"] and math.isclose(sum(scores.values()), 1.0, abs_tol=2e-4)
    assert lines[0] == max(scores, key=scores.__getitem__)

    done = d.cli("classify", MODEL, "Buy cheap pills online now", "--labels", "safe,unsafe", "--json")
    doc = json.loads(done.stdout)
    assert doc["object"] == "decision" and doc["label"] == lines[0]
    assert doc["scores"]["safe"] == pytest.approx(scores["safe"], abs=1e-4)

    refused = d.cli("classify", MODEL, "text", "--labels", "safe", check=False)
    assert refused.returncode != 0 and "--labels" in refused.stderr
    refused = d.cli("classify", MODEL, "text", "--labels", "safe,safe", check=False)
    assert refused.returncode != 0 and "twice" in refused.stderr


def test_a_cascade_s_judge_is_a_decision_model(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    auth = {"authorization": f"Bearer {keys.full}"}

    def chat(model: str, key: str = keys.full) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 48}
        headers = {"authorization": f"Bearer {key}"}
        return httpx.post(
            f"{d.url}/v1/chat/completions", json={**body, "temperature": 0}, headers=headers, timeout=180
        )

    r = chat("judged-strict")
    assert r.status_code == 200, r.text
    header = r.headers["x-blazar-cascade"]
    assert header.startswith("step=2/2") and f"escalated={MODEL}:judge-p=0." in header, header
    # The judge's tokens are the request's too: the ledger row counts more than the two answers.
    answer_tokens = r.json()["usage"]["completion_tokens"]
    trace = {"trace_id": r.headers["x-blazar-trace-id"]}
    row = ledger_row(d, trace, auth)
    assert row["completion_tokens"] > answer_tokens

    r = chat("judged-lenient")
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-cascade"].startswith("step=1/2"), r.headers["x-blazar-cascade"]

    # A key that may use the cascade and its models but not its judge: the judge is refused.
    no_judge = add_key(d.home, "no-judge", f"chat,models:judged-*,models:{MODEL}")
    r = chat("judged-lenient", no_judge)
    assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "MODEL_NOT_IN_SCOPE"
    assert JUDGE in r.json()["error"]["message"]


def test_the_best_of_judge_picks_among_valid_candidates(setup: tuple[DaemonProc, Keys]) -> None:
    d, keys = setup
    auth = {"authorization": f"Bearer {keys.full}"}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 200,
        "temperature": 0,
        "best_of": 2,
    }
    # OpenAI chat: the candidates ran on the engine, the judge read both valid ones.
    r = httpx.post(f"{d.url}/v1/chat/completions", json=body, headers=auth, timeout=300)
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-best-of"] == "ran=2, winner=0, why=judge", r.headers["x-blazar-best-of"]
    answer_tokens = r.json()["usage"]["completion_tokens"]
    trace = {"trace_id": r.headers["x-blazar-trace-id"]}
    row = ledger_row(d, trace, auth)
    assert row["completion_tokens"] > answer_tokens  # the judge's tokens are the request's too
    # Anthropic messages: translated candidates, the same judge.
    messages = {k: v for k, v in body.items() if k != "temperature"}
    r = httpx.post(
        f"{d.url}/v1/messages",
        json={**messages, "temperature": 0},
        headers={**auth, "anthropic-version": "2023-06-01"},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-blazar-best-of"].endswith("why=judge"), r.headers["x-blazar-best-of"]
