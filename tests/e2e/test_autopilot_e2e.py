"""``blazar autopilot`` on traffic the real daemon served: a model unloaded between uses, a
burst that queues on one slot, a prompt refused for its length. Each rule recommends its
change with the evidence and the config key to set, and ``--apply`` writes them into
config.toml (its comments kept) and the running daemon takes them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import MODEL, DaemonProc, make_home, start_daemon

pytestmark = pytest.mark.slow

CONFIG = f"""# tuned by hand, once
slots = 1

[models."{MODEL}"]
ctx = 256          # small on purpose
keep_alive_s = 1
"""


def _chat(url: str, content: str = "Say hello.", max_tokens: int = 4) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=180)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[DaemonProc]:
    home = make_home(tmp_path_factory.mktemp("autopilot") / "home", model_path, config=CONFIG)
    d = start_daemon(home)
    try:
        # unloaded between uses: each of three requests loads the model again
        for _ in range(3):
            assert _chat(d.url).status_code == 200
            deadline = time.monotonic() + 60
            while any(e["state"] != "stopped" for e in d.engines()) and time.monotonic() < deadline:
                time.sleep(0.2)
        # a burst on one slot: most wait for it
        statuses: list[int] = []
        burst = [
            threading.Thread(target=lambda: statuses.append(_chat(d.url, max_tokens=24).status_code))
            for _ in range(8)
        ]
        for t in burst:
            t.start()
        for t in burst:
            t.join(180)
        assert statuses == [200] * 8
        # too long for 256 tokens a slot
        refused = _chat(d.url, content="word " * 400)
        assert refused.status_code == 400 and refused.json()["error"]["blazar_code"] == "PROMPT_TOO_LONG"
        yield d
    finally:
        d.stop()


def test_each_rule_recommends_its_change_with_evidence(served: DaemonProc) -> None:
    doc = json.loads(served.cli("autopilot", "--since", "1h", "--json").stdout)
    by_rule = {r["rule"]: r for r in doc["recommendations"]}
    assert set(by_rule) == {"queueing", "context", "reloads"}, doc
    queueing, context, reloads = by_rule["queueing"], by_rule["context"], by_rule["reloads"]
    assert (queueing["key"], queueing["now"], queueing["value"]) == (f'models."{MODEL}".slots', 1, 2)
    assert "waited over 0.5 s" in queueing["evidence"]
    assert (context["key"], context["now"]) == (f'models."{MODEL}".ctx', 256) and context["value"] >= 512
    assert "refused as too long" in context["evidence"]
    assert reloads["key"] == f'models."{MODEL}".keep_alive_s' and reloads["value"] >= 60
    assert "unloaded idle" in reloads["evidence"]
    table = served.cli("autopilot", "--since", "1h").stdout
    assert "queueing" in table and f'models."{MODEL}".slots = 2' in table and "--apply" in table


def test_apply_writes_the_keys_and_keeps_the_file_s_comments(served: DaemonProc) -> None:
    done = served.cli("autopilot", "--since", "1h", "--apply")
    assert done.returncode == 0, done.stderr
    text = (served.home / "config.toml").read_text()
    assert "# tuned by hand, once" in text and "slots = 2" in text
    assert "ctx = 256" not in text and "keep_alive_s = 1\n" not in text, text
    said = " ".join(done.stdout.split())
    assert f"applied now by the running daemon: models.{MODEL}.keep_alive_s" in said, said
    # slots and ctx are the engine's: it restarts with them (or starts with them, if unloaded)
    assert "engines that restart with the new settings" in said or "used by engines as they start" in said
