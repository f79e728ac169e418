"""Run each CUDA lane installed on this machine against a small model; write what ran.

    python scripts/gpu_check.py [--out FILE] [--gguf FILE] [--hf-model DIR] [--sd-model FILE]
                                [--timeout-s SECONDS] [--max-tokens N] [--[no-]relay-workers]

Lanes, each run only where it is installed and a GPU is present:

* llama.cpp: a CUDA build of ``llama-server`` (``$BLAZAR_LLAMA_SERVER`` or on ``PATH``),
  all layers on the GPU, on the GGUF test model (SmolLM2-135M, ``make models``);
* vLLM and SGLang (``$BLAZAR_VLLM`` / ``$BLAZAR_SGLANG``, else found as the lanes find
  them) on a Hugging Face safetensors directory: ``--hf-model DIR``, else the GGUF test
  model converted to one with transformers (needs ``transformers``, ``torch`` and
  ``gguf`` in this interpreter; nothing is downloaded);
* stable-diffusion.cpp: ``sd-server`` (``$BLAZAR_SD_SERVER`` or on ``PATH``) with
  ``--sd-model FILE`` (a diffusion checkpoint), one 256x256 image.

Each text lane streams one chat reply through the engine's OpenAI API and records the
load time, time to first token and decode tokens per second. The result file
(default ``bench/results/DATE-gpu-check.json``) says, per lane, what ran with which
version and argv, the figures, or why it was skipped (``no NVIDIA GPU``, ``not
installed``, ``no model``) or failed (with the engine's last stderr lines). Exit code 1
when a lane failed, else 0. Every engine started here is stopped before it exits.

With ``--relay-workers`` (the default on 8 cores or more) it first runs the relay
benchmark with ``workers = 1, 2, 4`` at 256 and 1,024 paced streams against the instant
upstream (``bench/workers.py``), whose result lands in ``bench/results/`` too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.census import Census, take_census  # noqa: E402
from actors.config import EngineConfig  # noqa: E402
from actors.engines import llamacpp, multinode, sdcpp, sglang, vllm  # noqa: E402
from actors.engines._gpu import Program, memory_fraction, program_version  # noqa: E402
from actors.engines.spec import LaunchSpec  # noqa: E402

GIB = 1 << 30
KEY = "gpu-check-key"
PROMPT = "Write three sentences about the sea."


class LaneResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    lane: str
    status: Literal["ran", "skipped", "failed"]
    reason: str | None = None
    version: str | None = None
    model: str | None = None
    argv: list[str] | None = None
    load_s: float | None = None
    ttft_s: float | None = None
    completion_tokens: int | None = None
    decode_tokens_per_s: float | None = None
    image_s: float | None = None
    reply: str | None = None


class CheckResult(msgspec.Struct, kw_only=True):
    kind: str = "gpu-check"
    """Not a harness result (no ``schema`` key): ``scripts/bench_report.py`` leaves it alone."""
    date: str
    host: str
    python: str
    driver: str | None
    gpus: list[dict[str, Any]]
    note: str | None
    results: list[LaneResult]
    multinode: list[dict[str, Any]] = []
    """Dry runs of ``blazar plan --nodes`` for this machine and one like it (nothing starts)."""


class Failed(Exception):
    pass


def _redact(argv: list[str]) -> list[str]:
    return ["***" if i and argv[i - 1] == "--api-key" else a for i, a in enumerate(argv)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engine(argv: list[str], env: dict[str, str], port: int, health: str, timeout_s: float) -> Iterator[float]:
    """Start ``argv``, wait for ``health`` to answer 200, yield the load time; always stop it.
    The child's stdin is a pipe from us (the watchdog's lifeline)."""
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.PIPE, stderr=err)
        started = time.monotonic()
        try:
            while True:
                if child.poll() is not None:
                    raise Failed(f"exited with {child.returncode} during start: {_tail(err)}")
                if time.monotonic() - started > timeout_s:
                    raise Failed(f"not healthy within {timeout_s:.0f} s: {_tail(err)}")
                try:
                    headers = {"Authorization": f"Bearer {KEY}"}
                    if (
                        httpx.get(f"http://127.0.0.1:{port}{health}", headers=headers, timeout=2).status_code
                        == 200
                    ):
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            yield time.monotonic() - started
        finally:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _tail(err: Any, lines: int = 8) -> str:
    err.seek(0)
    text = err.read().decode(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "(no stderr)"


def stream_chat(port: int, model: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat: time to first token, decode rate between first and last token."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    sent = time.monotonic()
    first = last = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as resp:
        if resp.status_code != 200:
            raise Failed(f"chat answered {resp.status_code}: {resp.read().decode(errors='replace')[:300]}")
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    last = time.monotonic()
                    first = first or last
                    pieces.append(text)
    if first is None or last is None:
        raise Failed("the engine streamed no text")
    tokens = int(usage.get("completion_tokens") or len(pieces))
    rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else None
    return {
        "ttft_s": round(first - sent, 4),
        "completion_tokens": tokens,
        "decode_tokens_per_s": round(rate, 1) if rate else None,
        "reply": "".join(pieces)[:200],
    }


# -- lanes ------------------------------------------------------------------------------


def check_llamacpp(gguf: Path | None, args: argparse.Namespace) -> LaneResult:
    binary = llamacpp.find_llama_server(os.environ.get("BLAZAR_LLAMA_SERVER"))
    if binary is None:
        return LaneResult(lane="llama.cpp", status="skipped", reason="not installed: no llama-server binary")
    backend = llamacpp.gpu_backend(binary)
    version = llamacpp.engine_version(binary)
    if backend != "CUDA":
        why = f"llama-server at {binary} is not a CUDA build (GPU backend: {backend or 'none'})"
        return LaneResult(lane="llama.cpp", status="skipped", reason=why, version=version)
    if gguf is None:
        return LaneResult(lane="llama.cpp", status="skipped", reason="no GGUF model (run `make models`)")
    spec = LaunchSpec(model="smollm2-135m", path=str(gguf), ctx_per_slot=4096, slots=1, gpu_layers=999)
    port = _free_port()
    argv = llamacpp.build_argv(spec, port=port, api_key=KEY, binary=binary)
    return _run_text("llama.cpp", argv, {}, port, "/health", spec.model, version, args)


def check_safetensors_lane(
    name: str, module: Any, hf_model: Path | str, census: Census, args: argparse.Namespace
) -> LaneResult:
    finder = vllm.find_vllm if module is vllm else sglang.find_sglang
    program: Program | None = finder(os.environ.get(f"BLAZAR_{name.upper()}"))
    if program is None:
        return LaneResult(lane=name, status="skipped", reason=f"not installed: pip install {name}")
    version = program_version(program, label=name)
    if isinstance(hf_model, str):
        return LaneResult(lane=name, status="skipped", reason=hf_model, version=version)
    size = sum(p.stat().st_size for p in hf_model.glob("*.safetensors"))
    fraction = memory_fraction(2 * size + 2 * GIB, census.gpus[0].total)
    spec = LaunchSpec(model="smollm2-135m", path=str(hf_model), ctx_per_slot=2048, slots=4)
    port = _free_port()
    if module is vllm:
        argv = vllm.build_argv(spec, port=port, api_key=KEY, program=program, gpu_memory_fraction=fraction)
    else:
        argv = sglang.build_argv(spec, port=port, api_key=KEY, program=program, mem_fraction=fraction)
    return _run_text(name, argv, module.launch_env(spec), port, module.API.health, spec.model, version, args)


def _run_text(
    name: str, argv: list[str], env: dict[str, str], port: int, health: str, model: str, version: str | None,
    args: argparse.Namespace,
) -> LaneResult:  # fmt: skip
    shown = _redact(argv)
    try:
        with engine(argv, env, port, health, args.timeout_s) as load_s:
            figures = stream_chat(port, model, args.max_tokens)
    except (Failed, httpx.HTTPError, OSError, ValueError) as exc:
        return LaneResult(
            lane=name, status="failed", reason=str(exc), version=version, model=model, argv=shown
        )
    return LaneResult(
        lane=name, status="ran", version=version, model=model, argv=shown, load_s=round(load_s, 2), **figures
    )


def check_sdcpp(sd_model: Path | None, args: argparse.Namespace) -> LaneResult:
    program = sdcpp.find_sd_server(os.environ.get("BLAZAR_SD_SERVER"))
    if program is None:
        return LaneResult(
            lane="stable-diffusion.cpp", status="skipped", reason="not installed: no sd-server binary"
        )
    version = program_version(program, label="stable-diffusion.cpp")
    if sd_model is None:
        why = "no diffusion checkpoint: pass --sd-model FILE (nothing is downloaded)"
        return LaneResult(lane="stable-diffusion.cpp", status="skipped", reason=why, version=version)
    spec = LaunchSpec(model="sd", path=str(sd_model), ctx_per_slot=1, slots=1)
    port = _free_port()
    argv = sdcpp.build_argv(spec, port=port, api_key=KEY, program=program, flash_attention=True)
    shown = _redact(argv)
    try:
        with engine(argv, {}, port, sdcpp.API.health, args.timeout_s) as load_s:
            sent = time.monotonic()
            resp = httpx.post(
                f"http://127.0.0.1:{port}/v1/images/generations",
                json={"prompt": "a lighthouse at dusk", "n": 1, "size": "256x256"},
                timeout=args.timeout_s,
            )
            image_s = time.monotonic() - sent
            if resp.status_code != 200 or not resp.json()["data"][0].get("b64_json"):
                raise Failed(f"image generation answered {resp.status_code}: {resp.text[:300]}")
    except (Failed, httpx.HTTPError, OSError, ValueError, KeyError, IndexError) as exc:
        return LaneResult(
            lane="stable-diffusion.cpp", status="failed", reason=str(exc), version=version,
            model=sd_model.name, argv=shown,
        )  # fmt: skip
    return LaneResult(
        lane="stable-diffusion.cpp", status="ran", version=version, model=sd_model.name, argv=shown,
        load_s=round(load_s, 2), image_s=round(image_s, 2),
    )  # fmt: skip


# -- models -----------------------------------------------------------------------------


def find_gguf(given: str | None) -> Path | None:
    if given:
        return Path(given)
    from registry.store import Store

    cache = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models"))
    record = Store(cache / "models").find("smollm2-135m")
    return Path(record.path) if record is not None and Path(record.path).exists() else None


def hf_model_from(given: str | None, gguf: Path | None, workdir: Path) -> Path | str:
    """The safetensors directory to run, or why there is none: ``given``, else the GGUF
    test model converted with transformers (dequantized to bfloat16)."""
    if given:
        return Path(given)
    if gguf is None:
        return "no safetensors model: pass --hf-model DIR, or run `make models` to convert the GGUF one"
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        return f"no safetensors model: pass --hf-model DIR (converting the GGUF needs {exc.name})"
    src = workdir / "gguf"
    src.mkdir()
    (src / "model.gguf").symlink_to(gguf)  # transformers wants a .gguf name; the store's blob has none
    out = workdir / "smollm2-135m-hf"
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file="model.gguf")
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file="model.gguf", torch_dtype=torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    except Exception as exc:  # any failure of a third-party conversion is a skip with its reason
        return f"no safetensors model: converting the GGUF failed ({type(exc).__name__}: {exc})"
    return out


# -- multi-node plans (dry run) -----------------------------------------------------------

_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-405b-like": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
        "num_hidden_layers": 126, "num_attention_heads": 128, "num_key_value_heads": 8,
        "vocab_size": 128256, "torch_dtype": "bfloat16",
    },
    "qwen2.5-72b-like": {
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 8192, "intermediate_size": 29568,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 152064, "torch_dtype": "bfloat16",
    },
}  # fmt: skip
"""Two representative configs (as tests/actors/test_multinode_plan.py pins them)."""


def check_multinode(census: Census) -> list[dict[str, Any]]:
    """The multi-node plan of each shape and lane over this machine's GPUs and one machine
    like it: the sizes, memory per GPU and argv (key redacted), or why it does not fit."""
    if not census.gpus:
        return [{"status": "skipped", "reason": "no NVIDIA GPU"}]
    here = multinode.GpuNode(
        host="127.0.0.1", gpus=len(census.gpus), gpu_memory=min(g.total for g in census.gpus)
    )
    nodes = [here, msgspec.structs.replace(here, host="192.0.2.2")]
    found: list[dict[str, Any]] = []
    for shape, config in _SHAPES.items():
        facts = multinode.model_facts(config, name=shape)
        spec = LaunchSpec(model=shape, path=f"/models/{shape}", ctx_per_slot=8192, slots=4,
                          architecture=facts.architecture)  # fmt: skip
        for lane in ("vllm", "sglang"):
            row: dict[str, Any] = {
                "model": shape,
                "lane": lane,
                "nodes": len(nodes),
                "gpus_per_node": here.gpus,
            }
            try:
                plan = multinode.plan(facts, nodes, spec, lane=lane, port=8000, api_key=KEY)
            except multinode.PlanRefused as exc:
                found.append({**row, "status": "no_fit", "reason": str(exc)})
                continue
            found.append({
                **row, "status": "planned", "tensor_parallel": plan.tensor_parallel,
                "pipeline_parallel": plan.pipeline_parallel, "layer_split": plan.layer_split,
                "need_per_gpu": [n.need_per_gpu for n in plan.nodes],
                "argv": [_redact(n.argv) for n in plan.nodes],
            })  # fmt: skip
    return found


# -- main -------------------------------------------------------------------------------


def run_relay_workers() -> None:
    """The multi-worker relay benchmark (issue 34) where the cores exist to show it: its
    result lands in bench/results/ beside the lanes'."""
    env = {**os.environ, "BLAZAR_BENCH_WORKERS": "1,2,4", "BLAZAR_BENCH_LEVELS": "256,1024"}
    command = [sys.executable, "-m", "bench", "run", "--only", "workers", "--runs", "3"]
    done = subprocess.run(command, cwd=ROOT, env=env, check=False)
    print(f"relay workers benchmark: exit code {done.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--gguf", default=os.environ.get("BLAZAR_TEST_MODEL"))
    parser.add_argument("--hf-model", default=os.environ.get("BLAZAR_TEST_HF_MODEL"))
    parser.add_argument("--sd-model", default=os.environ.get("BLAZAR_TEST_SD_MODEL"))
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--relay-workers",
        action=argparse.BooleanOptionalAction,
        default=(os.cpu_count() or 1) >= 8,
        help="also run the relay benchmark with workers = 1, 2, 4 at 256 and 1,024 streams "
        "(bench/workers.py; default: on a machine with 8 cores or more)",
    )
    args = parser.parse_args(argv)
    if args.relay_workers:
        run_relay_workers()

    census = take_census()
    now = dt.datetime.now(dt.UTC)
    results: list[LaneResult] = []
    lanes = ("llama.cpp", "vllm", "sglang", "stable-diffusion.cpp")
    if not census.gpus:
        why = "no NVIDIA GPU"  # the census's note, at the top of the file, says why
        cfg = EngineConfig()
        found = {
            "llama.cpp": llamacpp.find_llama_server(os.environ.get("BLAZAR_LLAMA_SERVER")),
            "vllm": vllm.lane(cfg, os.environ.get("BLAZAR_VLLM")),
            "sglang": sglang.lane(cfg, os.environ.get("BLAZAR_SGLANG")),
            "stable-diffusion.cpp": sdcpp.lane(cfg, os.environ.get("BLAZAR_SD_SERVER")),
        }
        for name in lanes:
            installed = "installed" if found[name] is not None else "not installed"
            results.append(LaneResult(lane=name, status="skipped", reason=f"{why}; {installed}"))
    else:
        gguf = find_gguf(args.gguf)
        sd_model = Path(args.sd_model) if args.sd_model else None
        results.append(check_llamacpp(gguf, args))
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            hf_model: Path | str | None = None
            for name, module in (("vllm", vllm), ("sglang", sglang)):
                finder = vllm.find_vllm if module is vllm else sglang.find_sglang
                if hf_model is None and finder(os.environ.get(f"BLAZAR_{name.upper()}")) is not None:
                    hf_model = hf_model_from(args.hf_model, gguf, Path(tmp))
                results.append(check_safetensors_lane(name, module, hf_model or "", census, args))
        results.append(check_sdcpp(sd_model, args))

    doc = CheckResult(
        date=now.isoformat(timespec="seconds"),
        host=platform.node(),
        python=platform.python_version(),
        driver=census.driver,
        gpus=[
            {"index": g.index, "name": g.name, "total_bytes": g.total, "free_bytes": g.free}
            for g in census.gpus
        ],
        note=census.note,
        results=results,
        multinode=check_multinode(census),
    )
    out = args.out or ROOT / "bench" / "results" / f"{now:%Y-%m-%d}-gpu-check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n")
    for r in results:
        figures = f"{r.decode_tokens_per_s} tok/s, TTFT {r.ttft_s} s" if r.decode_tokens_per_s else ""
        print(f"{r.lane:22} {r.status:8} {r.version or '':28} {figures or r.reason or ''}")
    for m in doc.multinode:
        sizes = f"tp {m['tensor_parallel']} x pp {m['pipeline_parallel']}" if m["status"] == "planned" else ""
        print(f"plan {m.get('model', ''):20} {m.get('lane', ''):7} {m['status']:8} {sizes}")
    print(f"wrote {out}")
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
