"""A vLLM model over two daemons on loopback: the head (H) runs rank 0, the worker daemon (W)
runs rank 1 when H tells it to over the authenticated peer link.

Neither vLLM nor a GPU is here, so both daemons run the stand-in ``tests/fake_vllm.py`` as
their configured ``[engine] vllm``: it records its argv and environment, and H's serves the
OpenAI API. The model is a tiny safetensors directory installed in each daemon's own store.

Checked: W starts its part with exactly the command line ``blazar plan MODEL`` prints for
rank 1 (over the model's configured nodes), with W's own copy of the model, and H runs rank
0's; H answers a chat through its stand-in; unloading the model on H stops W's part;
``kill -9`` of W takes its part along, H stops its engine naming the lost node, and H's next
request gets a clear error in the caller's dialect (OpenAI's and Anthropic's shapes)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from registry.imports import import_path
from registry.store import Store
from tests import fake_vllm
from tests.registry.test_formats import hf_config, hf_dir, llama_tensors
from tests.support import add_key, home_env, pid_alive, start_daemon, wait_gone, wait_until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
HEAD_NODE = "host=127.0.0.1,gpus=1,gpu_mem_gb=80"
WORKER_NODE = "host=127.0.0.2,gpus=1,gpu_mem_gb=80,name=w"
HI = [{"role": "user", "content": "Say hello."}]


def _home(root: Path, model_dir: Path, program: Path, config: str = "") -> Path:
    root.mkdir(parents=True)
    import_path(Store(root / "models"), model_dir, MODEL)
    (root / "config.toml").write_text(f'[engine]\nvllm = "{program}"\n{config}')
    return root


def _env(home: Path, log: Path) -> dict[str, str]:
    return {**home_env(home), "FAKE_LOG": str(log)}


def _engine(url: str, auth: dict[str, str]) -> dict[str, Any]:
    doc = httpx.get(f"{url}/admin/engines", headers=auth, timeout=30).json()
    return next((e for e in doc["engines"] if e["model"] == MODEL), {})


def _failed(url: str, auth: dict[str, str]) -> dict[str, Any] | None:
    engine = _engine(url, auth)
    return engine if engine.get("state") == "failed" else None


def _parts(url: str, auth: dict[str, str]) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/admin/multinode/parts", headers=auth, timeout=30).json()["parts"]


def test_a_model_runs_over_two_daemons(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    model_dir = hf_dir(
        tmp_path / "src", hf_config(max_position_embeddings=4096), [llama_tensors()], name=MODEL
    )
    program = fake_vllm.install(tmp_path / "bin")
    w_log, h_log = tmp_path / "w.jsonl", tmp_path / "h.jsonl"

    w_home = _home(tmp_path / "w", model_dir, program)
    peer_key = add_key(w_home, "head", "chat,admin")
    w = start_daemon(w_home, env=_env(w_home, w_log))
    h_home = _home(
        tmp_path / "h", model_dir, program,
        f"""
[models."{MODEL}"]
ctx = 2048
slots = 2
nodes = ["{HEAD_NODE}", "{WORKER_NODE}"]

[[remotes]]
name = "w"
url = "{w.url}"
key = "{peer_key}"
poll_s = 0.3
poll_max_s = 1
""",
    )  # fmt: skip
    caller = add_key(h_home, "caller", "chat,admin")
    auth = {"Authorization": f"Bearer {caller}"}
    w_auth = {"Authorization": f"Bearer {peer_key}"}
    h = start_daemon(h_home, env=_env(h_home, h_log))
    try:
        oai = openai.OpenAI(base_url=f"{h.url}/v1", api_key=caller, max_retries=0, timeout=60)
        reply = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "hello from the head"

        # W started rank 1 with the plan's command line, over its own copy of the model
        # (the head does not wait for its headless worker, so W's process may still be starting)
        (worker,) = wait_until(lambda: fake_vllm.starts(w_log), timeout_s=30, what="W's part to start")
        (head,) = fake_vllm.starts(h_log)
        port = head["argv"][head["argv"].index("--port") + 1]
        planned = h.cli("plan", MODEL, "--port", port, "--json")  # over the configured nodes
        plan = json.loads(planned.stdout)
        h_path = Store(h_home / "models").get(MODEL).path
        w_path = Store(w_home / "models").get(MODEL).path
        assert h_path != w_path
        rank1 = plan["nodes"][1]["argv"]
        assert rank1[:2] == ["vllm", "serve"] and rank1[2] == h_path and "--headless" in rank1
        assert worker["argv"] == [str(program), "serve", w_path, *rank1[3:]]
        wanted_env = {k: v for k, v in plan["nodes"][1]["env"].items() if k.startswith("VLLM_")}
        assert worker["env"] == wanted_env and wanted_env["VLLM_PP_LAYER_PARTITION"] == "1,1"
        rank0 = [a if a != "ENGINE_KEY" else head["argv"][head["argv"].index("--api-key") + 1]
                 for a in plan["nodes"][0]["argv"]]  # fmt: skip
        assert head["argv"] == [str(program), *rank0[1:]]
        parts = _parts(w.url, w_auth)
        assert [(p["rank"], p["state"], p["argv"]) for p in parts] == [(1, "running", worker["argv"])]

        # unloading the model on H stops W's part
        done = httpx.post(f"{h.url}/admin/models/{MODEL}/unload", headers=auth, timeout=60)
        assert done.status_code == 200, done.text
        assert wait_gone([worker["pid"], head["pid"]]) == []
        wait_until(lambda: _parts(w.url, w_auth) == [], timeout_s=10, what="W to forget the part")

        # again, then kill -9 of W: its part goes with it and H stops its engine, saying why
        assert oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4).choices  # type: ignore[arg-type]
        starts = wait_until(lambda: fake_vllm.starts(w_log)[1:], timeout_s=30, what="W's part again")
        worker2 = starts[-1]
        assert worker2["pid"] != worker["pid"] and pid_alive(worker2["pid"])
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.wait()
        assert wait_gone([worker2["pid"]]) == []
        engine = wait_until(lambda: _failed(h.url, auth), timeout_s=10, what="H to notice the lost worker")
        assert engine is not None and "worker node 1 (peer 'w')" in engine["last_error"], engine
        with pytest.raises(openai.APIStatusError) as lost:
            oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)  # type: ignore[arg-type]
        error = lost.value.body  # the client keeps the envelope's "error" object
        assert (
            isinstance(error, dict)
            and lost.value.status_code == 502
            and error["blazar_code"] == "ENGINE_CRASHED"
        ), error
        assert "worker node 1 (peer 'w')" in error["message"] and "cannot be reached" in error["message"]
        ant = anthropic.Anthropic(base_url=h.url, api_key=caller, max_retries=0, timeout=60)
        with pytest.raises(anthropic.APIStatusError) as said:
            ant.messages.create(model=MODEL, max_tokens=4, messages=HI)  # type: ignore[arg-type]
        body = said.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert "worker node 1 (peer 'w')" in body["error"]["message"]
        why = h.cli("why").stdout  # the last request that failed, and why
        assert "ENGINE_CRASHED" in why and "worker node 1 (peer 'w')" in " ".join(why.split()), why
    finally:
        h.stop()
        w.stop()
