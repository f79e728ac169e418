"""Run llama.cpp's own HTTP server from the ``xllamacpp`` wheel as a child process.

``python -m actors.engines.llamacpp_host -m MODEL.gguf --port N …`` accepts
llama-server's flag names, maps them onto ``xllamacpp.CommonParams`` (the wheel
has no command-line parser of its own) and serves the full llama-server API.
The gateway cannot tell it from a ``llama-server`` binary.

Lifetime rules: SIGTERM/SIGINT exit cleanly (the server's destructor drains);
end-of-file on stdin means the parent is gone (even after ``kill -9``), and the
host exits at once so an engine never outlives its daemon.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from actors.engines.lifeline import host_lifetime

__all__ = ["build_params", "main", "parse_args"]

_POOLING = {"none": "NONE", "mean": "MEAN", "cls": "CLS", "last": "LAST", "rank": "RANK"}
_ROPE_SCALING = ("none", "linear", "yarn")
_SPEC_TYPES = {
    "none": "NONE",
    "ngram-simple": "NGRAM_SIMPLE",
    "ngram-map-k": "NGRAM_MAP_K",
    "ngram-map-k4v": "NGRAM_MAP_K4V",
    "ngram-mod": "NGRAM_MOD",
    "ngram-cache": "NGRAM_CACHE",
}
_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def _env_int(name: str) -> int | None:
    """llama-server's environment form of a flag (``LLAMA_ARG_THREADS=4``), or None."""
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        raise SystemExit(f"llamacpp_host: {name}={value!r} is not a whole number") from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llamacpp_host", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None)
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("--embeddings", "--embedding", action="store_true")
    p.add_argument("--pooling", choices=sorted(_POOLING), default=None)
    p.add_argument("--reranking", "--rerank", action="store_true")
    p.add_argument("-kvu", "--kv-unified", action="store_true")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None)
    # llama.cpp's RPC workers (rpc_backend: the wheel's missing backend, loaded from our build)
    p.add_argument("--rpc", default=None, metavar="HOST:PORT,...")
    p.add_argument("-ts", "--tensor-split", default=None, metavar="N0,N1,...")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-tb", "--threads-batch", type=int, default=None)
    p.add_argument("-b", "--batch-size", type=int, default=None)
    p.add_argument("-ub", "--ubatch-size", type=int, default=None)
    p.add_argument("-ctk", "--cache-type-k", choices=_CACHE_TYPES, default=None)
    p.add_argument("-ctv", "--cache-type-v", choices=_CACHE_TYPES, default=None)
    p.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default=None)
    p.add_argument("--rope-scaling", choices=_ROPE_SCALING, default=None)
    p.add_argument("--rope-scale", type=float, default=None)
    p.add_argument("--rope-freq-scale", type=float, default=None)
    p.add_argument("--rope-freq-base", type=float, default=None)
    p.add_argument("--yarn-orig-ctx", type=int, default=None)
    p.add_argument("--slot-save-path", default=None)
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--sleep-idle-seconds", type=int, default=None)
    p.add_argument("--no-slots", action="store_true")
    p.add_argument("--props", action="store_true")
    p.add_argument("--jinja", action="store_true")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--chat-template", default=None)
    p.add_argument("-mm", "--mmproj", default=None)
    p.add_argument("-s", "--seed", type=int, default=None)
    # One list for both, in the order given: the engine numbers adapters so.
    p.add_argument("--lora", dest="loras", action="append", default=[], metavar="FILE")
    p.add_argument("--lora-scaled", dest="loras", action="append", nargs=2, metavar=("FILE", "SCALE"))
    p.add_argument("--lora-init-without-apply", action="store_true")
    # The wheel cannot load control vectors: they are baked into a copy of the model (control_bake).
    p.add_argument("--control-vector", dest="control_vectors", action="append", default=[], metavar="FILE")
    p.add_argument(
        "--control-vector-scaled", dest="control_vectors", action="append", nargs=2, metavar=("FILE", "SCALE")
    )
    p.add_argument("--control-vector-layer-range", type=int, nargs=2, default=None, metavar=("START", "END"))
    p.add_argument("-md", "--model-draft", "--spec-draft-model", default=None)
    p.add_argument("--spec-draft-n-max", "--draft-max", "--draft", type=int, default=None)
    p.add_argument("--spec-draft-n-min", "--draft-min", type=int, default=None)
    p.add_argument("--spec-type", choices=sorted(_SPEC_TYPES), default=None)
    for kind in ("simple", "map-k", "map-k4v"):
        p.add_argument(f"--spec-ngram-{kind}-size-n", type=int, default=None)
        p.add_argument(f"--spec-ngram-{kind}-size-m", type=int, default=None)
    p.add_argument("--spec-ngram-mod-n-max", type=int, default=None)
    p.add_argument("--spec-ngram-mod-n-min", type=int, default=None)
    p.add_argument("--mlock", action="store_true")
    p.add_argument("--no-mmap", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-disable", action="store_true")
    return p.parse_args(list(argv))


def build_params(ns: argparse.Namespace) -> Any:
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = ns.model
    p.n_ctx = ns.ctx_size
    p.n_parallel = ns.parallel
    if hasattr(p, "hostnames"):  # xllamacpp 2026.10 and later
        p.hostnames = [ns.host]
    else:  # earlier releases: one address
        p.hostname = ns.host
    p.port = ns.port
    if ns.api_key:
        p.api_keys = [ns.api_key]
    if ns.alias:
        p.model_alias = {ns.alias}
    if ns.reranking:  # as llama-server's flag: embeddings on, pooled by the model's ranking head
        p.embedding = True
        p.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
    elif ns.embeddings:
        p.embedding = True
        # Without a pooling type llama.cpp refuses OpenAI-style embeddings.
        p.pooling_type = getattr(
            xlc.llama_pooling_type, f"LLAMA_POOLING_TYPE_{_POOLING[ns.pooling or 'mean']}"
        )
    elif ns.pooling:
        p.pooling_type = getattr(xlc.llama_pooling_type, f"LLAMA_POOLING_TYPE_{_POOLING[ns.pooling]}")
    if ns.kv_unified and hasattr(p, "kv_unified"):  # releases before llama.cpp's unified KV lack it
        p.kv_unified = True
    if ns.n_gpu_layers is not None:
        p.n_gpu_layers = ns.n_gpu_layers
    if ns.tensor_split:
        shares = [float(n) for n in ns.tensor_split.replace("/", ",").split(",")]
        p.tensor_split = shares + [0.0] * (len(p.tensor_split) - len(shares))
    # As llama-server: a flag wins over its LLAMA_ARG_* variable, and the batch threads default
    # to the decode threads (llama.cpp picks both from the cores when neither is given).
    threads = ns.threads if ns.threads is not None else _env_int("LLAMA_ARG_THREADS")
    threads_batch = ns.threads_batch if ns.threads_batch is not None else _env_int("LLAMA_ARG_THREADS_BATCH")
    if threads is not None:
        p.cpuparams.n_threads = threads
    if threads_batch is not None or threads is not None:
        p.cpuparams_batch.n_threads = threads_batch if threads_batch is not None else threads
    if ns.batch_size is not None:
        p.n_batch = ns.batch_size
    if ns.ubatch_size is not None:
        p.n_ubatch = ns.ubatch_size
    if ns.cache_type_k:
        p.cache_type_k = getattr(xlc.ggml_type, f"GGML_TYPE_{ns.cache_type_k.upper()}")
    if ns.cache_type_v:
        p.cache_type_v = getattr(xlc.ggml_type, f"GGML_TYPE_{ns.cache_type_v.upper()}")
    if ns.flash_attn:
        kind = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}[ns.flash_attn]
        p.flash_attn_type = getattr(xlc.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{kind}")
    if ns.rope_scaling:
        p.rope_scaling_type = getattr(
            xlc.llama_rope_scaling_type, f"LLAMA_ROPE_SCALING_TYPE_{ns.rope_scaling.upper()}"
        )
    # llama-server's --rope-scale N means a frequency scale of 1/N.
    if ns.rope_scale:
        p.rope_freq_scale = 1.0 / ns.rope_scale
    if ns.rope_freq_scale:
        p.rope_freq_scale = ns.rope_freq_scale
    if ns.rope_freq_base:
        p.rope_freq_base = ns.rope_freq_base
    if ns.yarn_orig_ctx is not None:
        p.yarn_orig_ctx = ns.yarn_orig_ctx
    if ns.slot_save_path:
        # llama-server's own parser ends the folder with a separator; the server joins the
        # file name to it as it is.
        p.slot_save_path = os.path.join(ns.slot_save_path, "")
    p.endpoint_metrics = ns.metrics
    p.endpoint_slots = not ns.no_slots
    p.endpoint_props = ns.props
    if ns.jinja:
        p.use_jinja = True
    if ns.no_warmup:
        p.warmup = False
    if ns.chat_template:
        p.chat_template = ns.chat_template
    if ns.mmproj:
        p.mmproj.path = ns.mmproj
    if ns.seed is not None:
        p.sampling.seed = ns.seed
    # Warnings stay on: llama.cpp says so when it quietly does less than asked (a capped
    # context, a failed mlock), and the engine actor names those degrades from them.
    p.verbosity = 3 if ns.verbose else (-1 if ns.log_disable else 2)
    _load_mode(p, ns, xlc)
    _adapters(p, ns, xlc)
    _speculation(p, ns, xlc)
    if ns.sleep_idle_seconds:
        p.sleep_idle_seconds = ns.sleep_idle_seconds
    return p


def _load_mode(p: Any, ns: argparse.Namespace, xlc: Any) -> None:
    """``--mlock`` / ``--no-mmap`` as llama-server reads them: one load mode in this llama.cpp."""
    if not (ns.mlock or ns.no_mmap) or not hasattr(p, "load_mode"):
        return
    mode = ("MLOCK" if ns.no_mmap else "MMAP_MLOCK") if ns.mlock else "NONE"
    p.load_mode = getattr(xlc.llama_load_mode, f"LLAMA_LOAD_MODE_{mode}")


def _adapters(p: Any, ns: argparse.Namespace, xlc: Any) -> None:
    """``--lora`` / ``--lora-scaled``: LoRA adapters loaded with the model, numbered in order."""
    loras = []
    for given in ns.loras:
        path, scale = (given, "1") if isinstance(given, str) else given
        info = xlc.CommonAdapterLoraInfo()
        info.path, info.scale = path, float(scale)
        loras.append(info)
    if loras:
        p.lora_adapters = loras
    if ns.lora_init_without_apply:
        p.lora_init_without_apply = True


def _speculation(p: Any, ns: argparse.Namespace, xlc: Any) -> None:
    """A draft model (``--model-draft``) or a draftless kind (``--spec-type``), with lengths."""
    spec = p.speculative
    kinds = xlc.common_speculative_type
    if ns.model_draft:
        spec.draft.mparams.path = ns.model_draft
        spec.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    if ns.spec_type:
        spec.types = [getattr(kinds, f"COMMON_SPECULATIVE_TYPE_{_SPEC_TYPES[ns.spec_type]}")]
    if ns.spec_draft_n_max is not None:
        spec.draft.n_max = ns.spec_draft_n_max
    if ns.spec_draft_n_min is not None:
        spec.draft.n_min = ns.spec_draft_n_min
    for kind, field in (("simple", "ngram_simple"), ("map_k", "ngram_map_k"), ("map_k4v", "ngram_map_k4v")):
        if (n := getattr(ns, f"spec_ngram_{kind}_size_n")) is not None:
            getattr(spec, field).size_n = n
        if (m := getattr(ns, f"spec_ngram_{kind}_size_m")) is not None:
            getattr(spec, field).size_m = m
    if ns.spec_ngram_mod_n_max is not None:
        spec.ngram_mod.n_max = ns.spec_ngram_mod_n_max
    if ns.spec_ngram_mod_n_min is not None:
        spec.ngram_mod.n_min = ns.spec_ngram_mod_n_min


def _steer(ns: argparse.Namespace, note: Callable[[str], None]) -> str | None:
    """With control vectors: ``ns.model`` becomes a copy of the model with them baked in, in a
    temp folder (returned, for removal once loaded); None without (or when that fails)."""
    if not ns.control_vectors:
        return None
    from actors.engines.control_bake import BakeError, bake

    vectors = [(v, 1.0) if isinstance(v, str) else (v[0], float(v[1])) for v in ns.control_vectors]
    span = ns.control_vector_layer_range
    layers = (span[0], span[1]) if span else None
    folder = tempfile.mkdtemp(prefix="blazar-steered-")
    try:
        ns.model = str(bake(ns.model, vectors, layers, Path(folder)))
    except (BakeError, OSError, ValueError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"error: cannot apply the control vectors: {exc}", file=sys.stderr, flush=True)
        return None
    note(f"control vectors baked into {ns.model}")
    return folder


def _attach_rpc(servers: list[str], xlc: Any, note: Callable[[str], None]) -> bool:
    """``--rpc``: each worker becomes a device of this process (``rpc_backend``); False, with
    the reason on stderr, when that cannot be done."""
    from actors.engines.rpc_backend import (
        RpcAttachError,
        attach,
        cached_module,
        missing_module,
        name_lost_workers,
    )

    version = getattr(xlc, "__version__", None)
    module = cached_module(version) if version else None
    if module is None:
        print(f"error: --rpc: {missing_module(version)}", file=sys.stderr, flush=True)
        return False
    try:
        devices = attach(servers, xlc.xllamacpp.__file__, module)
    except RpcAttachError as exc:
        print(f"error: --rpc: {exc}", file=sys.stderr, flush=True)
        return False
    note(f"RPC workers {', '.join(servers)} attached as devices {', '.join(devices)}")
    name_lost_workers(servers, module, lambda line: print(line, file=sys.stderr, flush=True))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.path.isfile(ns.model):
        print(f"error: model file not found: {ns.model}", file=sys.stderr)
        return 2
    import xllamacpp as xlc

    stop = host_lifetime()

    def note(line: str) -> None:  # the daemon keeps the tail of stderr (the console, `blazar logs`)
        print(f"llamacpp_host: {line}", file=sys.stderr, flush=True)

    note(f"loading {ns.model} with xllamacpp {getattr(xlc, '__version__', '?')}")
    if ns.rpc and not _attach_rpc(ns.rpc.split(","), xlc, note):
        return 1
    steered = _steer(ns, note)
    if steered is None and ns.control_vectors:
        return 2
    try:
        server = xlc.Server(build_params(ns))
    except RuntimeError as exc:
        print(f"error: llama.cpp could not start with model {ns.model}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if steered is not None:  # loaded (mapped) or failed: the copy's name is no longer needed
            shutil.rmtree(steered, ignore_errors=True)
    if ns.rpc:
        from actors.engines.rpc_backend import watch_workers

        watch_workers(ns.rpc.split(","), lambda line: print(line, file=sys.stderr, flush=True))
    print(f"READY {server.listening_address}", flush=True)
    note(f"llama.cpp server listening on {server.listening_address}")
    while not stop.wait(0.5):
        pass
    note("stopping")
    # Dropping the last reference runs the server's graceful shutdown.
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
