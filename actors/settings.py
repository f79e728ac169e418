"""How a model's engine starts, and where each of its settings came from.

``resolve_launch`` is the one place the launch settings are decided: the runtime
starts engines from its ``spec``, and ``blazar explain`` shows its ``settings``,
built from the same values in the same pass, so the explanation cannot drift
from what the engine gets. Pure: the caller passes the model's header facts, the
``llama-server`` binary found (or None) and how to plan GPU layers.

A setting's ``source`` is one of:

- ``default``: the built-in default (nothing set it);
- ``config``: a top-level key of config.toml (``default_ctx``, ``engine.threads``…);
- ``model``: the model itself, its GGUF header (training context, chat template)
  or its settings (a Modelfile's TEMPLATE, SYSTEM, PARAMETER);
- ``override``: the model's own table, ``[models."NAME"]`` in config.toml;
- ``profile``: the model's tuned profile (``blazar tune``), where its table leaves the key unset;
- ``request``: a request changed it on the running engine (Ollama ``num_ctx``, an
  embeddings request);
- ``derived``: computed from the others (named in ``note``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from actors.config import ModelOverride, RuntimeConfig, SpecSetting, Speculation, Tunables
from actors.context import choose_context, context_limit, describe_clamp, rope_factor
from actors.engines.lane import Lane
from actors.engines.llamacpp import CPU_PROMPT_BATCH, LaunchSpec, prompt_batch_for
from actors.engines.routing import Route, not_installed, route
from actors.engines.spec import DiffusionSettings, GpuSettings, LoraLoad, SpecLoad
from actors.errors import UnsupportedEngine
from actors.speculation import Candidate, pair_problem
from registry.errors import RegistryError
from registry.formats import detect
from registry.gguf import ModelInfo
from registry.split import RpcSplit
from registry.store import Adapter, ModelRecord
from registry.template import TemplateFacts, facts_of
from registry.weights import lane_format

__all__ = [
    "FALLBACK_CTX",
    "Explanation",
    "Resolved",
    "Setting",
    "Source",
    "explain_running",
    "resolve_launch",
]

FALLBACK_CTX = 4096
"""The training context assumed for a model whose header does not say."""

Source = Literal["default", "config", "model", "override", "profile", "request", "derived"]

_DEFAULTS = Tunables()


class Setting(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    value: Any
    source: Source
    key: str | None = None
    """Where exactly: the config key (``default_ctx``, ``models."x".ctx``), the GGUF key, …"""
    note: str | None = None


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    spec: LaunchSpec
    settings: list[Setting]
    keep_alive_s: float
    route: Route
    """Which lane runs it, and why each other lane was not taken."""
    refusal: str | None = None
    """Why no lane here can run it (``resolve_launch(..., unrouted=True)`` only): the spec
    then names the lane that would, for a plan to show."""
    rpc_split: RpcSplit | None = None
    """How the model's layers are spread over this machine and its RPC workers (``rpc``)."""


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /api/explain/{model}`` and ``blazar explain``."""

    model: str
    path: str
    loaded: bool
    """An engine for the model runs now; ``settings`` are then the ones it runs with."""
    settings: list[Setting]


def _top(config: RuntimeConfig, name: str, key: str | None = None) -> tuple[Any, Source, str]:
    """A top-level (or ``engine.``) value and whether the config set it or it is the default."""
    key = key or name
    if key.startswith("engine."):
        field = key.removeprefix("engine.")
        value, default = getattr(config.engine, field), getattr(_DEFAULTS.engine, field)
    else:
        value, default = getattr(config, name), getattr(_DEFAULTS, name)
    configured = key in config.configured or value != default
    return value, ("config" if configured else "default"), key


def _format_of(path: str) -> str:
    """What routing matches a lane's formats against, from the model's own headers."""
    try:
        return detect(path).lane_format
    except (OSError, ValueError, RegistryError):
        return "gguf"  # the store's files are GGUF; one that cannot be read fails at load, not here


def _override(model: str, field: str) -> str:
    return f'models."{model}".{field}'


def _tuned(config: RuntimeConfig, model: str, field: str) -> tuple[Any, Source, str] | None:
    """``field`` from the model's table in config.toml, else from its tuned profile; None: neither sets it."""
    value = getattr(config.models.get(model) or ModelOverride(), field)
    if value is not None:
        return value, "override", _override(model, field)
    profile = config.profiles.get(model)
    if profile is not None and (value := getattr(profile, field)) is not None:
        return value, "profile", f"profile of {model} (blazar tune)"
    return None


def resolve_launch(
    config: RuntimeConfig,
    record: ModelRecord,
    info: ModelInfo,
    *,
    lanes: Mapping[str, Lane | None],
    plan_gpu_layers: Callable[[int, int], int | None],
    plan_memory_fraction: Callable[[int, int, int], float | None] = lambda ctx, slots, tp: None,
    plan_rpc: Callable[[int, int], RpcSplit | None] = lambda ctx, slots: None,
    unrouted: bool = False,
    adapter_path: Callable[[Adapter], str] | None = None,
    candidate: Callable[[str, str | None], Candidate | None] = lambda name, lane: None,
    parked: str | None = None,
    template_facts: Callable[[str | None], TemplateFacts] = facts_of,
) -> Resolved:
    """The launch spec of ``record``'s engine under ``config``, with each setting's source.

    ``lanes`` are the lanes installed here (``actors.engines.routing.installed``);
    ``plan_gpu_layers(ctx_per_slot, slots)`` offloads from the fit plan (None: CPU);
    ``plan_memory_fraction(ctx_per_slot, slots, tensor_parallel)`` sizes a GPU serving
    engine's share of each GPU from the fit plan (None: not measurable);
    ``plan_rpc(ctx_per_slot, slots)`` splits a model with ``rpc`` workers (None: the header
    cannot be read);
    ``adapter_path(adapter)`` is where a LoRA adapter's blob lies (by default beside the model's);
    ``candidate(name, lane)`` describes an installed model for a draft pairing (None: not
    installed), with ``lane`` the one it runs on (None: its own);
    ``parked`` is why the governor parked the model's speculation (None: it did not);
    ``template_facts(template)`` says what the chat template can express (the store keeps
    them: ``Store.template_facts``).
    Raises ``UnsupportedEngine`` when no lane here can run the model, unless ``unrouted``
    (a plan): then the spec is for the lane that would run it, and ``refusal`` says why not."""
    name = record.name
    over: ModelOverride = config.models.get(name) or ModelOverride()
    out: list[Setting] = []

    def add(
        setting: str, value: Any, source: Source, key: str | None = None, note: str | None = None
    ) -> None:
        out.append(Setting(name=setting, value=value, source=source, key=key, note=note))

    # -- context ----------------------------------------------------------
    trained = info.context_length or FALLBACK_CTX
    add("ctx_train", info.context_length, "model", "GGUF context_length", None if info.context_length else
        f"the header does not say; {FALLBACK_CTX} is assumed")  # fmt: skip
    cap, cap_source, cap_key = _top(config, "default_ctx")
    ctx_source: Source
    if over.ctx:
        asked, ctx_source, ctx_key = over.ctx, "override", _override(name, "ctx")
    elif trained < cap:
        asked, ctx_source, ctx_key = trained, "model", "GGUF context_length"
    else:
        asked, ctx_source, ctx_key = cap, cap_source, cap_key
    scaling = over.rope_scaling
    factor = rope_factor(info.context_length, scaling, over.rope_scale, asked)
    choice = choose_context(
        asked, context_limit(info.context_length, factor), strict=config.strict, model=name, what="ctx"
    )
    clamp = describe_clamp(choice.asked, choice.ctx, trained=info.context_length, extended=bool(factor))
    why = None if over.ctx or ctx_source == "model" else f"min(training context {trained}, default_ctx {cap})"
    add("ctx_per_slot", choice.ctx, ctx_source, ctx_key, clamp or why)
    slots, slots_source, slots_key = _top(config, "slots")
    if (tuned := _tuned(config, name, "slots")) is not None:
        slots, slots_source, slots_key = tuned
    add("slots", slots, slots_source, slots_key)
    add("ctx_total", choice.ctx * slots, "derived", None, "ctx_per_slot x slots (llama.cpp -c)")
    if scaling:
        add("rope_scaling", scaling, "override", _override(name, "rope_scaling"))
    else:
        add("rope_scaling", None, "default", None, "no context extension")
    if over.rope_scale is not None:
        add("rope_scale", factor, "override", _override(name, "rope_scale"))
    elif factor is not None:
        add("rope_scale", factor, "derived", None, f"just enough for ctx {asked}")
    add("strict", *_top(config, "strict"))

    # -- engine -----------------------------------------------------------
    needs = (
        frozenset({"vision"} if record.projector else ())
        | frozenset({"embeddings"} if over.embeddings else ())
        | frozenset({"rerank"} if info.reranker else ())
    )
    fmt = lane_format(record) if record.files else _format_of(record.path)  # a tree: its manifest's
    chosen = route(fmt, needs=needs, pin=over.engine, lanes=lanes)
    lane = lanes.get(chosen.lane) if chosen.lane else None
    refusal = None
    if lane is None:
        pinned = f" (pinned: {_override(name, 'engine')} = {over.engine!r})" if over.engine else ""
        refusal = (
            f"no engine here can run model '{name}' ({fmt}){pinned}: {not_installed(chosen, over.engine)}; "
            "install the lane or change the pin"
        )
        if not unrouted:
            raise UnsupportedEngine(refusal)
        lane = _absent(chosen, over.engine)
    lane_key = chosen.lane or lane.name  # the stand-in for a lane not installed is named by its key
    binary = lane.binary
    release = over.engine_version or lane.release
    if over.engine_version:
        add("engine_version", release, "override", _override(name, "engine_version"))
    elif release:
        add("engine_version", release, "derived", None, "the lane's active version (`blazar engine use`)")
    else:
        add("engine_version", None, "default", None, "what the daemon was installed with")
    if refusal:
        add("engine", None, "derived", None, refusal)
    elif over.engine:
        add("engine", lane.kind, "override", _override(name, "engine"), binary)
    elif chosen.lane == "llamacpp" and config.engine.llama_server:
        add("engine", lane.kind, "config", "engine.llama_server", binary)
    elif binary:
        add("engine", lane.kind, "derived", None, f"{lane.kind} found on PATH: {binary}")
    elif chosen.lane == "llamacpp":
        add(
            "engine",
            lane.kind,
            "default",
            None,
            "no llama-server: llama.cpp's server from the xllamacpp wheel",
        )
    else:
        add("engine", lane.kind, "default", None, f"no {lane.name} binary: its wheel, run by our host module")
    rpc, rpc_split, refusal = _rpc_settings(
        name, over, lane_key, lane, add, lambda: plan_rpc(choice.ctx, slots), refusal, unrouted=unrouted
    )
    tuned_layers = _tuned(config, name, "gpu_layers")
    gpu_layers = tuned_layers[0] if tuned_layers is not None else None
    if tuned_layers is not None:
        add("gpu_layers", *tuned_layers)
    elif rpc:
        gpu_layers = rpc_split.gpu_layers if rpc_split is not None else RPC_ALL_LAYERS
        why = "the split could not be planned: every layer to the devices"
        if rpc_split is not None:
            why = "layers on the RPC workers (and GPUs), from the split"
        add("gpu_layers", gpu_layers, "derived", None, why)
    else:
        gpu_layers = plan_gpu_layers(choice.ctx, slots)
        if gpu_layers is None:
            add("gpu_layers", None, "default", None, "CPU lane (or GPUs not measurable: llama.cpp decides)")
        else:
            add("gpu_layers", gpu_layers, "derived", None, "fit plan against the GPUs' free memory")
    at_once = lane.sequences if lane.sequences is not None else None if gpu_layers else lane.cpu_sequences
    if at_once is not None and slots > at_once:
        slots = at_once
        where = "" if lane.sequences is not None else " on the CPU"
        note = f"{lane.name} runs {slots} sequence(s) at a time{where}; more wait in the gateway's queue"
        out[:] = [
            Setting(name="slots", value=slots, source="derived", key=None, note=note)
            if s.name == "slots"
            else Setting(name="ctx_total", value=choice.ctx * slots, source="derived", key=None, note=s.note)
            if s.name == "ctx_total"
            else s
            for s in out
        ]
    tuned_batch = _tuned(config, name, "prompt_batch")
    batch = prompt_batch_for(gpu_layers=gpu_layers, configured=tuned_batch[0] if tuned_batch else None)
    vectors = bool(over.embeddings) or info.reranker
    step = LaunchSpec(model=name, path="", ctx_per_slot=choice.ctx, slots=slots, prompt_batch=batch,
                      embeddings=vectors).prompt_step  # fmt: skip
    if vectors and step != batch:
        batch = step
        add(
            "prompt_batch",
            batch,
            "derived",
            None,
            "a slot's context: llama.cpp embeds or ranks an input in one step",
        )
    elif tuned_batch is not None:
        add("prompt_batch", *tuned_batch)
    else:
        note = f"{CPU_PROMPT_BATCH} on the CPU lane" if batch else "llama.cpp's own (512) on a GPU"
        add("prompt_batch", batch, "default", None, note)
    threads, t_source, t_key = _top(config, "threads", "engine.threads")
    if (tuned := _tuned(config, name, "threads")) is not None:
        threads, t_source, t_key = tuned
    add("threads", threads, t_source, t_key, None if threads else "llama.cpp decides")
    llama: dict[str, Any] = {}  # llama.cpp's own flags: shown as unused, and not passed, on another lane
    for field, default in (
        ("micro_batch", "the prompt batch"),
        ("kv_cache", "the engine's own (f16)"),
        ("flash_attn", "the engine's own (auto)"),
    ):
        tuned = _tuned(config, name, field)
        if tuned is None:
            add(field, None, "default", None, default)
        elif lane_key != "llamacpp":
            add(field, *tuned, f"unused: the {lane_key} lane does not read it")
        else:
            add(field, *tuned)
            llama[field] = tuned[0]
    base_args, a_source, a_key = _top(config, "extra_args", "engine.extra_args")
    if chosen.lane != "llamacpp" and base_args:
        # engine.extra_args are llama.cpp's flags: another lane gets only the model's own.
        base_args, a_source = [], "default"
    extra = [*base_args, *(over.extra_args or [])]
    if over.extra_args:
        then = f"engine.extra_args {base_args} then the model's" if base_args else None
        add("extra_args", extra, "override", _override(name, "extra_args"), then)
    else:
        add("extra_args", extra, a_source, a_key)
    if over.embeddings is not None:
        add("embeddings", bool(over.embeddings), "override", _override(name, "embeddings"))
    else:
        add("embeddings", False, "default", None, "an embeddings request turns it on")
    if info.reranker:
        add("reranking", True, "model", "GGUF pooling_type", "a reranker: serves /v1/rerank only")
    gpu, diffusion = _lane_settings(
        name, over, lane_key, info.architecture, add,
        lambda tp: plan_memory_fraction(choice.ctx, slots, tp),
    )  # fmt: skip

    # -- template and defaults --------------------------------------------
    settings = record.settings
    template = (settings.template if settings else None) or info.chat_template
    if settings and settings.template:
        add("chat_template", "model settings", "model", "Modelfile TEMPLATE")
    elif info.chat_template:
        add("chat_template", "GGUF", "model", "GGUF tokenizer.chat_template")
    else:
        add("chat_template", None, "default", None, "none in the model: llama.cpp's built-in")
    native_tools = bool(template and "tools" in template) and "tools" in lane.capabilities
    add("native_tools", native_tools, "derived", None, "the chat template handles tools" if native_tools else
        "tools are emulated by the gateway")  # fmt: skip
    facts = template_facts(template)
    system_turns = facts.system_turns
    add("system_turns", system_turns, "derived", None, "from the chat template")
    thinking = facts.thinking if "thinking" in lane.capabilities else "none"
    think_effort = thinking != "none" and facts.reads_effort
    add("thinking", thinking, "derived", None, "from the chat template" if "thinking" in lane.capabilities
        else "this engine's reasoning is not controlled")  # fmt: skip
    system = settings.system if settings else None
    add("system", system, "model" if system else "default", "Modelfile SYSTEM" if system else None)
    defaults = dict(settings.parameters) if settings else {}
    add("defaults", defaults, "model" if defaults else "default", "Modelfile PARAMETER" if defaults else None)
    out_cap, o_source, o_key = _top(config, "max_output_tokens")
    if over.max_output_tokens is not None:
        out_cap, o_source, o_key = over.max_output_tokens, "override", _override(name, "max_output_tokens")
    out_cap = out_cap or None
    add("max_output_tokens", out_cap, o_source, o_key, None if out_cap else "no cap")
    keep_alive, k_source, k_key = _top(config, "keep_alive_s")
    if over.keep_alive_s is not None:
        keep_alive, k_source, k_key = over.keep_alive_s, "override", _override(name, "keep_alive_s")
    add("keep_alive_s", keep_alive, k_source, k_key, "a request's keep_alive replaces it for that request")
    sleep, s_source, s_key = _top(config, "idle_sleep_s")
    if over.idle_sleep_s is not None:
        sleep, s_source, s_key = over.idle_sleep_s, "override", _override(name, "idle_sleep_s")
    if not sleep or sleep <= 0:
        add("idle_sleep_s", None, s_source, s_key, "never sleeps")
        sleep = None
    elif lane_key != "llamacpp":
        add("idle_sleep_s", None, s_source, s_key, f"unused: the {lane_key} lane does not sleep")
        sleep = None
    else:
        sleep = max(1, round(sleep))
        why = "releases the model's memory when idle; a request wakes it"
        add("idle_sleep_s", sleep, s_source, s_key, why)

    loras = _lora_settings(record, lane_key, add, adapter_path)
    generates = record.kind == "chat" and not over.embeddings and not info.reranker
    speculation = _spec_settings(config, over, record, lane_key, add, candidate, parked, generates=generates)

    spec = LaunchSpec(
        model=name,
        kind=record.kind,
        path=record.path,
        ctx_per_slot=choice.ctx,
        slots=slots,
        embeddings=bool(over.embeddings),
        reranking=info.reranker,
        native_tools=native_tools,
        system_turns=system_turns,
        thinking=thinking,
        think_effort=think_effort,
        llguidance=lane.llguidance,
        token_bytes_max=info.token_bytes_max,
        chat_template=settings.template if settings else None,
        system=system,
        defaults=defaults,
        threads=threads,
        extra_args=extra,
        gpu_layers=gpu_layers,
        projector=record.projector,
        ctx_train=info.context_length,
        ctx_asked=choice.asked if choice.clamped else None,
        rope_scaling=scaling if factor else None,
        rope_scale=factor,
        max_output_tokens=out_cap,
        idle_sleep_s=sleep,
        prompt_batch=batch,
        micro_batch=llama.get("micro_batch"),
        kv_cache=llama.get("kv_cache"),
        flash_attn=llama.get("flash_attn"),
        lane=lane_key,
        engine_version=release,
        architecture=info.architecture or None,
        gpu=gpu,
        diffusion=diffusion,
        rpc=rpc,
        tensor_split=rpc_split.tensor_split if rpc_split is not None else [],
        loras=loras,
        speculation=speculation,
    )
    return Resolved(
        spec=spec, settings=out, keep_alive_s=keep_alive, route=chosen, refusal=refusal, rpc_split=rpc_split
    )


def _lora_settings(
    record: ModelRecord, lane: str, add: Callable[..., None], path: Callable[[Adapter], str] | None
) -> list[LoraLoad]:
    """The model's LoRA adapters (``blazar lora add``), loaded by the llama.cpp lane."""
    if not record.adapters:
        add("loras", [], "default", None, "none (`blazar lora add MODEL FILE.gguf` adds one)")
        return []
    shown = [f"{i}: {a.name} x{a.scale:g}" for i, a in enumerate(record.adapters)]
    if lane != "llamacpp":
        add("loras", shown, "model", "blazar lora add", f"unused: the {lane} lane loads no LoRA adapters")
        return []
    add("loras", shown, "model", "blazar lora add", "a request's `lora` sets their scales (docs/models.md)")
    where = path or (lambda a: str(Path(record.path).parent / f"sha256-{a.digest.removeprefix('sha256:')}"))
    return [LoraLoad(name=a.name, path=where(a), scale=a.scale) for a in record.adapters]


def _spec_settings(
    config: RuntimeConfig,
    over: ModelOverride,
    record: ModelRecord,
    lane: str,
    add: Callable[..., None],
    candidate: Callable[[str, str | None], Candidate | None],
    parked: str | None,
    *,
    generates: bool,
) -> SpecLoad | None:
    """Speculative decoding: the model's ``spec``, else the top-level one; a draft only where
    ``pair_problem`` finds none, n-gram lookup only on the llama.cpp lane."""
    asked: SpecSetting
    if over.spec is not None:
        asked, source, key = over.spec, "override", _override(record.name, "spec")
    else:
        asked, source, key = _top(config, "spec")
    if asked == "off":
        add("spec", "off", source, key)
        return None
    wanted = Speculation(ngram="ngram-simple") if asked == "ngram" else asked
    assert isinstance(wanted, Speculation)
    shown = f"draft {wanted.draft}" if wanted.draft else wanted.ngram
    shown = f"{shown}, max {wanted.max}" + (f", min {wanted.min}" if wanted.min else "")
    if lane != "llamacpp":
        add("spec", "off", source, key, f"asked: {shown}; unused: the {lane} lane runs no speculation here")
        return None
    if not generates:
        add(
            "spec",
            "off",
            source,
            key,
            f"asked: {shown}; unused: the model embeds or ranks, it does not generate",
        )
        return None
    if parked:
        add("spec", "off", "derived", key, f"asked: {shown}; the governor {parked}")
        return None
    if wanted.draft is None:
        add("spec", shown, source, key, "llama.cpp's draftless n-gram lookup (--spec-type)")
        return SpecLoad(ngram=wanted.ngram, max=wanted.max, min=wanted.min)
    mine, theirs = candidate(record.name, lane), candidate(wanted.draft, None)
    problem = f"'{wanted.draft}' is not installed" if theirs is None else None
    if problem is None and mine is not None and theirs is not None:
        problem = pair_problem(mine, theirs)
    if problem:
        add("spec", "off", "derived", key, f"asked: {shown}; refused: {problem}")
        return None
    assert theirs is not None
    add("spec", shown, source, key, "the draft model shares the model's vocabulary (--model-draft)")
    return SpecLoad(draft_model=theirs.name, draft_path=theirs.path, max=wanted.max, min=wanted.min)


RPC_ALL_LAYERS = 999
"""``-ngl`` when a model has RPC workers but no plan: every layer to the devices."""


def _rpc_settings(
    name: str,
    over: ModelOverride,
    lane_key: str,
    lane: Lane,
    add: Callable[..., None],
    plan: Callable[[], RpcSplit | None],
    refusal: str | None,
    *,
    unrouted: bool,
) -> tuple[list[str], RpcSplit | None, str | None]:
    """A model's RPC workers: on the llama.cpp lane, the addresses and the split; on a lane
    without RPC support, a refusal (a model too large for one machine must not start on one)."""
    if not over.rpc:
        return [], None, refusal
    key = _override(name, "rpc")
    if lane_key != "llamacpp":
        add("rpc", over.rpc, "override", key, f"unused: the {lane_key} lane does not read it")
        return [], None, refusal
    problem = None if refusal else lane.rpc_problem()
    if problem:
        refusal = f"model '{name}' is split over RPC workers ({key} = {over.rpc}), but {problem}"
        if not unrouted:
            raise UnsupportedEngine(refusal)
    add("rpc", over.rpc, "override", key, problem or "llama.cpp --rpc: each worker's rpc-server is a device")
    if over.rpc_memory_mb is not None:
        add("rpc_memory_mb", over.rpc_memory_mb, "override", _override(name, "rpc_memory_mb"))
    else:
        add("rpc_memory_mb", None, "default", None, "each worker taken to offer what this machine has")
    if over.rpc_fallback is not None:
        add("rpc_fallback", over.rpc_fallback, "override", _override(name, "rpc_fallback"))
    else:
        add("rpc_fallback", None, "default", None, "a worker that does not answer refuses the start")
    split = plan()
    if split is None:
        why = "the header cannot be read: llama.cpp splits by free memory"
        add("tensor_split", None, "default", None, why)
    else:
        note = f"fit plan: layers per device by its memory ({split.verdict})"
        add("tensor_split", split.tensor_split, "derived", None, note)
    return list(over.rpc), split, refusal


def _absent(chosen: Route, pin: str | None) -> Lane:
    """A stand-in for the lane that would run a model but is not installed (a plan's subject):
    the pinned one, else the first that loads its format, else llama.cpp."""
    wanted = pin or next(
        (c.lane for c in chosen.considered if c.kind is None and c.why.startswith("not installed")),
        "llamacpp",
    )
    return Lane(
        name=wanted,
        kind="not installed",
        binary=None,
        argv=lambda spec, port, api_key: [],
        version=lambda: None,
        capabilities=frozenset(),
        formats=frozenset(),
        llguidance=False,
    )


_GPU_FIELDS = ("gpu_memory_fraction", "tensor_parallel", "quantization", "dtype", "tool_parser")
_DIFFUSION_FIELDS = ("components", "offload_to_cpu", "diffusion_fa", "vae_tiling", "weight_type")
_READ_BY = {"vllm": _GPU_FIELDS, "sglang": _GPU_FIELDS, "sdcpp": _DIFFUSION_FIELDS}


def _lane_settings(
    name: str,
    over: ModelOverride,
    lane: str,
    architecture: str | None,
    add: Callable[..., None],
    plan_memory_fraction: Callable[[int], float | None],
) -> tuple[GpuSettings, DiffusionSettings]:
    """The settings only some lanes read: the GPU serving engines' and stable-diffusion.cpp's.
    One set for a lane that does not read it is shown as unused, never dropped unseen."""
    read = _READ_BY.get(lane, ())
    for field in (*_GPU_FIELDS, *_DIFFUSION_FIELDS):
        value = getattr(over, field)
        if value is not None and field not in read:
            add(field, value, "override", _override(name, field), f"unused: the {lane} lane does not read it")
    gpu, diffusion = GpuSettings(), DiffusionSettings()
    if read is _GPU_FIELDS:
        tp = over.tensor_parallel or 1
        add("tensor_parallel", tp, *(("override", _override(name, "tensor_parallel")) if over.tensor_parallel
                                     else ("default", None)))  # fmt: skip
        fraction = over.gpu_memory_fraction
        if fraction is not None:
            add("gpu_memory_fraction", fraction, "override", _override(name, "gpu_memory_fraction"))
        else:
            fraction = plan_memory_fraction(tp)
            if fraction is None:
                add(
                    "gpu_memory_fraction",
                    None,
                    "default",
                    None,
                    "the GPUs cannot be measured: the lane's default",
                )
            else:
                add("gpu_memory_fraction", fraction, "derived", None,
                    "fit plan: weights and KV cache with 10 % headroom over the GPU's memory")  # fmt: skip
        parser = over.tool_parser
        if parser is not None:
            add("tool_parser", parser, "override", _override(name, "tool_parser"))
        else:
            add(
                "tool_parser",
                None,
                "derived",
                None,
                f"the one the lane knows for {architecture or 'the model'}",
            )
        for field in ("quantization", "dtype"):
            if getattr(over, field) is not None:
                add(field, getattr(over, field), "override", _override(name, field))
        gpu = GpuSettings(memory_fraction=fraction, tensor_parallel=tp, quantization=over.quantization,
                          dtype=over.dtype, tool_parser=parser)  # fmt: skip
    elif read is _DIFFUSION_FIELDS:
        for field in _DIFFUSION_FIELDS:
            if getattr(over, field) is not None:
                add(field, getattr(over, field), "override", _override(name, field))
        diffusion = DiffusionSettings(
            components={str(k): v for k, v in (over.components or {}).items()},
            offload_to_cpu=bool(over.offload_to_cpu),
            flash_attention=bool(over.diffusion_fa),
            vae_tiling=bool(over.vae_tiling),
            weight_type=over.weight_type,
        )
    return gpu, diffusion


def explain_running(resolved: Resolved, running: LaunchSpec | None) -> list[Setting]:
    """``resolved``'s settings, with those a request changed on the running engine
    (``running``, its spec now) marked as the request's."""
    if running is None:
        return resolved.settings
    changed = {
        "ctx_per_slot": running.ctx_per_slot,
        "ctx_total": running.ctx_total,
        "embeddings": running.embeddings,
        "prompt_batch": running.prompt_step,
    }
    out = []
    for s in resolved.settings:
        now = changed.get(s.name, s.value)
        if now != s.value:
            was = f"{s.value} from {s.source}" + (f" ({s.key})" if s.key else "")
            s = Setting(name=s.name, value=now, source="request", note=f"changed by a request; it was {was}")
        out.append(s)
    return out
