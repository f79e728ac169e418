"""``blazar tune`` on the real engine with a tiny budget: each trial restarts the engine with
its settings and is measured through the gateway, a setting pinned in config.toml is never
searched, and what is stored is what the trials and their confirmation decided. Which
settings win depends on the machine and its load, so the tests check the search and the
decision's consistency, never a speed; a stored profile read at start (written here
directly) is what ``explain`` shows and the engine's flags carry, and ``--reset`` drops it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actors.config import Profile
from actors.profiles import TunedProfile, profile_statement
from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

CONFIG = f"""# a hand-written file that tune must not touch
slots = 2              # a default for every model: a model's profile may differ
memory_budget_mb = 185 # 2 slots of 512 tokens need about 172 MiB, 4 about 195

[models."{MODEL}"]
ctx = 512
kv_cache = "f16"       # pinned: tune leaves it alone
"""

# A small workload so that the suite stays fast: four requests at once (slots are searched).
TUNE = ("tune", MODEL, "--concurrency", "4", "--budget", "3", "--ctx", "64", "--max-tokens", "8")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("tune") / "home", model_path, config=CONFIG)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def tuned(served: DaemonProc) -> dict:
    done = served.cli(*TUNE, "--json", "--apply", timeout_s=600, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_trial_is_measured_and_the_pinned_setting_is_not_searched(tuned: dict) -> None:
    trials = tuned["trials"]
    summary = [(t["changed"], t["score"], t["verdict"]) for t in trials]
    searched = [t for t in trials if not (t["changed"] or "").startswith("confirm")]
    assert trials[0]["changed"] is None and trials[0]["verdict"] == "baseline"
    assert trials[0]["values"]["slots"] == 2 and trials[0]["values"]["kv_cache"] == "f16"
    # slots first, the largest lever: 1, then 4 (2 is the baseline's); the budget ends there
    tried = [(t["changed"], t["values"]["slots"]) for t in searched[1:]]
    assert tried == [("slots", 1), ("slots", 4)], summary
    # 4 slots would not fit beside nothing in the 185 MiB budget: skipped, never started
    four = searched[2]
    assert four["score"] is None and four["verdict"].startswith("skipped: needs about 19"), four["verdict"]
    assert "is left beside the other loaded models" in four["verdict"]
    measured = [t for t in trials if t is not four]
    assert all(t["figures"]["ok"] == 8 and t["figures"]["decode_tps"] > 0 for t in measured), summary
    skipped = tuned["workload"]["skipped"]
    assert skipped["kv_cache"] == f'pinned by models."{MODEL}".kv_cache in config.toml'
    assert "gpu_layers" in skipped and skipped["threads"] == "the budget of 3 trials was spent"


def test_the_stored_profile_is_what_the_trials_decided(served: DaemonProc, tuned: dict) -> None:
    trials, profile = tuned["trials"], tuned["profile"]
    kept = [t for t in trials[1:3] if t["verdict"].startswith("kept")]
    if not kept:  # the baseline was the fastest: nothing to confirm, nothing stored
        assert len(trials) == 3 and profile == {}, trials
    else:  # the winner is measured again beside the baseline, and stored only if it wins again
        assert [t["changed"] for t in trials[3:]] == ["confirm baseline", "confirm best"], trials
        assert trials[-1]["values"] == kept[-1]["values"]
        confirmed = trials[-1]["verdict"].startswith("confirmed")
        assert confirmed == (trials[-1]["score"] > trials[-2]["score"] * 1.05), trials[-2:]
        assert profile == ({"slots": kept[-1]["values"]["slots"]} if confirmed else {}), profile
    rows = {
        s["name"]: s for s in httpx.get(f"{served.url}/api/explain/{MODEL}", timeout=30).json()["settings"]
    }
    assert rows["kv_cache"]["source"] == "override"
    assert rows["slots"]["source"] == ("profile" if profile else "config"), rows["slots"]
    # --apply: the engine is loaded with it when the command returns
    assert any(e["state"] == "ready" for e in served.engines())
    text = served.cli("tune", MODEL, "--show").stdout
    assert "baseline" in text and "not searched: kv_cache" in text


def test_a_second_tune_of_the_model_waits_its_turn_and_a_cancelled_one_changes_nothing(
    served: DaemonProc, tuned: dict
) -> None:
    body = {"model": MODEL, "budget": 2, "ctx": 64, "max_tokens": 8}
    first = httpx.post(f"{served.url}/api/tune", json=body, timeout=30)
    assert first.status_code == 202, first.text
    second = httpx.post(f"{served.url}/api/tune", json=body, timeout=30)
    error = second.json()["error"]
    assert second.status_code == 409 and error["blazar_code"] == "MODEL_BUSY", second.text
    assert first.json()["id"] in error["message"]
    job = first.json()["id"]
    assert httpx.post(f"{served.url}/v1/jobs/{job}/cancel", timeout=30).status_code == 200
    deadline = time.monotonic() + 120
    while httpx.get(f"{served.url}/v1/jobs/{job}", timeout=30).json()["status"] not in (
        "cancelled",
        "completed",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    shown = json.loads(served.cli("tune", MODEL, "--show", "--json").stdout)
    assert shown["profile"] == tuned["profile"] and shown["created_at"] == tuned["created_at"]
    rows = {
        s["name"]: s for s in httpx.get(f"{served.url}/api/explain/{MODEL}", timeout=30).json()["settings"]
    }
    assert rows["slots"]["source"] == ("profile" if tuned["profile"] else "config")


def test_a_stored_profile_is_read_at_start_and_reset_drops_it(served: DaemonProc, tuned: dict) -> None:
    assert (served.home / "config.toml").read_text() == CONFIG  # the user's file is untouched
    served.stop()
    profile = Profile(slots=1, flash_attn="on", micro_batch=64, threads=1)
    row = TunedProfile(model=MODEL, engine="test", created_at=0.0, profile=profile, trials=[], workload={})
    with sqlite3.connect(served.home / "blazar.db") as db:
        db.execute(*profile_statement(row))
    again = start_daemon(served.home)
    try:
        rows = {s["name"]: s for s in json.loads(again.cli("explain", MODEL, "--json").stdout)["settings"]}
        for key in ("slots", "flash_attn", "micro_batch", "threads"):
            assert rows[key]["source"] == "profile", rows[key]
        assert (rows["slots"]["value"], rows["flash_attn"]["value"], rows["micro_batch"]["value"]) == (
            1,
            "on",
            64,
        )
        assert rows["threads"]["value"] == 1 and rows["kv_cache"]["source"] == "override"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert httpx.post(f"{again.url}/v1/chat/completions", json=chat, timeout=120).status_code == 200
        log = (again.home / "logs" / "daemon.log").read_text()
        started = [line for line in log.splitlines() if "starting: pid" in line][-1]
        for flags in ("-np 1 ", "-t 1 ", "-ub 64 ", "-ctk f16 -ctv f16 ", "-fa on"):
            assert flags in started + " ", started
        reset = again.cli("tune", MODEL, "--reset")
        assert "profile dropped" in reset.stdout
        rows = {s["name"]: s for s in json.loads(again.cli("explain", MODEL, "--json").stdout)["settings"]}
        assert all(rows[k]["source"] != "profile" for k in ("slots", "flash_attn", "micro_batch", "threads"))
        missing = again.cli("tune", MODEL, "--show", check=False)
        assert missing.returncode != 0 and "no tuned profile" in missing.stderr
    finally:
        again.stop()
