"""The runtime's configuration types, usable without the HTTP layer."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

if TYPE_CHECKING:
    import ssl

__all__ = [
    "AdmissionConfig",
    "Cascade",
    "ClassConfig",
    "EngineConfig",
    "FailoverChain",
    "FailoverTarget",
    "McpServer",
    "ModelOverride",
    "Profile",
    "Remote",
    "RuntimeConfig",
    "SpecSetting",
    "Speculation",
    "Tunables",
    "parse_target",
]


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    llama_server: str | None = None
    """Path to a ``llama-server`` binary. Unset: look on PATH, else use the xllamacpp host."""
    mistralrs: str | None = None
    """Path to a mistral.rs binary (``mistralrs`` or ``mistralrs-server``). Unset: look on PATH,
    else use the host on the ``mistralrs`` wheel."""
    vllm: str | None = None
    """The ``vllm`` program (or a venv's ``python`` that has vLLM). Unset: found on PATH."""
    sglang: str | None = None
    """A ``python`` that has SGLang. Unset: found on PATH or importable."""
    mlx: str | None = None
    """The ``mlx_lm.server`` program (or a ``python`` that has mlx-lm). Unset: found."""
    sd_server: str | None = None
    """stable-diffusion.cpp's ``sd-server``. Unset: found on PATH."""
    rpc_server: str | None = None
    """llama.cpp's ``rpc-server`` (``ggml-rpc-server`` in newer builds), run by ``blazar
    rpc-worker``. Unset: found on PATH."""
    start_timeout_s: float = 120.0
    stop_grace_s: float = 5.0
    threads: int | None = None
    extra_args: list[str] = []
    breaker_crashes: int = 5
    """Crashes within ``breaker_window_s`` after which the engine refuses to start again."""
    breaker_window_s: float = 60.0


OutputCap = Annotated[int, msgspec.Meta(ge=0)]
RpcAddress = Annotated[
    str, msgspec.Meta(pattern=r"^([A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$", max_length=260)
]
"""``host:port`` (``[v6]:port``) of an ``rpc-server``."""


NgramKind = Literal["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]


class Speculation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Speculative decoding in full: ``spec = {draft = "NAME", max = 16}`` (a draft model)
    or ``spec = {ngram = "ngram-mod", max = 32}`` (llama.cpp's draftless n-gram lookup)."""

    draft: str | None = None
    """An installed model that drafts for this one: same lane and format, same vocabulary,
    never the model itself (checked when the engine starts; ``blazar explain`` says why not)."""
    ngram: NgramKind | None = None
    max: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    """The most tokens drafted per step."""
    min: Annotated[int, msgspec.Meta(ge=0, le=256)] = 0
    """The fewest tokens a draft must have to be tried."""

    def __post_init__(self) -> None:
        if (self.draft is None) == (self.ngram is None):
            raise ValueError(
                'spec names one way to draft: {draft = "MODEL"} or {ngram = "ngram-simple"} '
                "(not both, not neither)"
            )
        if self.min > self.max:
            raise ValueError(f"spec min ({self.min}) is above its max ({self.max})")


SpecSetting = Literal["off", "ngram"] | Speculation
"""``"off"``; ``"ngram"`` (llama.cpp's ``ngram-simple`` lookup, 16 tokens at most); or a
``Speculation`` table."""


KvCache = Literal["f16", "q8_0", "q4_0"]
FlashAttn = Literal["on", "off", "auto"]


class Profile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Launch settings ``blazar tune`` measured fastest for a model on this machine (stored in
    the ledger). Each applies where the model's own table in config.toml does not set the key."""

    slots: int | None = None
    threads: int | None = None
    prompt_batch: int | None = None
    micro_batch: int | None = None
    kv_cache: KvCache | None = None
    flash_attn: FlashAttn | None = None
    gpu_layers: int | None = None


class ModelOverride(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    engine: (
        Literal["llamacpp", "mistralrs", "vllm", "sglang", "mlx", "sdcpp", "whisper", "whispercpp", "piper"]
        | None
    ) = None
    """The lane that runs this model (a pin). Unset: routed by its format."""
    lanes: list[Literal["llamacpp", "mistralrs", "vllm", "sglang", "mlx", "sdcpp"]] | None = None
    """Other lanes it may run on beside its own, each its own engine; a request asks for one
    with the ``x-blazar-engine`` header. Unset: only its own."""
    engine_version: str | None = None
    """The installed version of its lane that runs it (``blazar engine list``). Unset: the active one."""
    ctx: int | None = None
    """Per-slot context. Above the training length it is clamped to it unless
    ``rope_scaling`` extends the model (``strict`` refuses instead)."""
    slots: int | None = None
    embeddings: bool | None = None
    extra_args: list[str] | None = None
    keep_alive_s: float | None = None
    """This model's idle keep-alive (overrides the top-level ``keep_alive_s``)."""
    idle_sleep_s: float | None = None
    """This model's idle sleep (overrides the top-level ``idle_sleep_s``)."""
    gpu_layers: int | None = None
    """Layers on the GPU (``-ngl``) for a GPU build of llama-server; unset: from the fit plan."""
    rope_scaling: Literal["yarn", "linear"] | None = None
    """Context extension beyond the training length (llama.cpp ``--rope-scaling``)."""
    rope_scale: Annotated[float, msgspec.Meta(gt=1)] | None = None
    """Extension factor (``--rope-scale``): a slot may hold training length times this.
    Unset with ``rope_scaling``: just enough for ``ctx``."""
    max_output_tokens: OutputCap | None = None
    """Output cap for requests that set none (overrides the top-level one; 0: no cap)."""
    prompt_batch: Annotated[int, msgspec.Meta(ge=16, le=8192)] | None = None
    """Prompt tokens the engine reads per step (llama.cpp ``-b``/``-ub``). Unset: 256 on
    the CPU, llama.cpp's own on a GPU. A cancelled prompt keeps its slot for up to one step."""
    micro_batch: Annotated[int, msgspec.Meta(ge=16, le=8192)] | None = None
    """The physical batch (llama.cpp ``-ub``), at most ``prompt_batch``. Unset: ``prompt_batch``."""
    threads: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    """CPU threads of this model's engine (``-t``; overrides ``engine.threads``)."""
    kv_cache: KvCache | None = None
    """The KV cache's type (llama.cpp ``-ctk``/``-ctv``): ``q8_0`` halves its memory, ``q4_0``
    quarters it, at some cost in quality. Unset: ``f16``."""
    flash_attn: FlashAttn | None = None
    """Flash attention (llama.cpp ``-fa``). Unset: llama.cpp's own choice (``auto``)."""
    # vLLM and SGLang
    gpu_memory_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    """The share of each GPU the engine takes at start. Unset: sized by the fit plan to the
    model's weights and KV cache, else the lane's default."""
    tensor_parallel: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    """GPUs the model is split over. Unset: 1."""
    quantization: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_-]+$")] | None = None
    """A quantization applied at load (``fp8``). Unset: the checkpoint's own."""
    dtype: Literal["auto", "float16", "bfloat16", "float32", "half"] | None = None
    tool_parser: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_.-]+$")] | None = None
    """The engine's tool-call parser. Unset: the one known for the model's architecture."""
    # stable-diffusion.cpp
    components: dict[Literal["vae", "clip_l", "clip_g", "t5xxl", "llm"], str] | None = None
    """Companion files of a standalone diffusion model (a Flux or SD3 transformer alone)."""
    offload_to_cpu: bool | None = None
    diffusion_fa: bool | None = None
    vae_tiling: bool | None = None
    weight_type: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_]+$")] | None = None
    """Convert the weights at load (``q8_0``, ``f16``…)."""
    late_chunking_max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Most tokens of one late-chunked input to this model (overrides the top-level limit)."""
    trust_certificate: bool | None = None
    """Whether admission refuses requests needing a capability this model's certificate marks
    FAIL (overrides ``[admission] trust_certificates``)."""
    # llama.cpp's RPC backend (docs/federation.md#rpc-splitting)
    rpc: Annotated[list[RpcAddress], msgspec.Meta(min_length=1, max_length=16)] | None = None
    """``host:port`` of each ``rpc-server`` (``blazar rpc-worker``) the model's layers are
    split over, beside this machine; needs a ``llama-server`` built with RPC support."""
    spec: SpecSetting | None = None
    """Speculative decoding for this model (docs/engines.md#speculative-decoding); unset: the
    top-level ``spec``."""
    rpc_memory_mb: list[Annotated[int, msgspec.Meta(ge=1)]] | None = None
    """The memory each of ``rpc`` offers (MiB, in the same order): the fit plan splits the
    layers by it. Unset: each is taken to offer as much as this machine has available."""
    # vLLM and SGLang over several machines (docs/engines.md#multi-node-vllm-and-sglang)
    nodes: Annotated[list[str], msgspec.Meta(min_length=2, max_length=64)] | None = None
    """The machines the model runs over, this one (the head) first, each as ``blazar plan
    --node`` takes it: ``host=ADDRESS,gpus=G,gpu_mem_gb=M[,name=PEER][,ifname=IF]``. Every node
    after the first names the ``[[remotes]]`` peer whose daemon starts its part (``name=``)."""
    rendezvous_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    """The head's port for the engines' own rendezvous across the nodes. Unset: 29501."""
    rpc_fallback: Literal["none", "remaining"] | None = None
    """When one of ``rpc`` does not answer as the engine starts: ``remaining`` re-plans the
    split over this machine and the workers that answer (refused, naming the missing one, when
    this machine cannot hold the rest); unset or ``none``: refused until it answers again."""

    def __post_init__(self) -> None:
        if self.nodes is not None:
            _check_nodes(self.nodes, rpc=self.rpc is not None)
        if self.rpc is None:
            if self.rpc_memory_mb is not None:
                raise ValueError('rpc_memory_mb goes with rpc = ["host:port", ...] (the workers it sizes)')
            if self.rpc_fallback is not None:
                raise ValueError('rpc_fallback goes with rpc = ["host:port", ...] (the workers it is about)')
            return
        if len(set(self.rpc)) != len(self.rpc):
            raise ValueError(f"rpc names a worker more than once: {self.rpc}")
        if self.rpc_memory_mb is not None and len(self.rpc_memory_mb) != len(self.rpc):
            raise ValueError(
                f"rpc_memory_mb has {len(self.rpc_memory_mb)} value(s) for {len(self.rpc)} worker(s) in rpc: "
                "give one per worker, in the same order"
            )


def _check_nodes(nodes: list[str], *, rpc: bool) -> None:
    from actors.engines.multinode import PlanRefused, parse_node  # it imports the lanes, which import us

    if rpc:
        raise ValueError(
            "nodes (vLLM or SGLang over machines) and rpc (llama.cpp workers) exclude each other"
        )
    try:
        parsed = [parse_node(spec) for spec in nodes]
    except PlanRefused as exc:
        raise ValueError(str(exc).replace("--node", "nodes:")) from None
    for rank, node in enumerate(parsed[1:], start=1):
        if node.name is None:
            raise ValueError(
                f"nodes[{rank}] ({nodes[rank]!r}) names no peer: add name=PEER, the [[remotes]] entry "
                "of the daemon on that machine, which starts its part"
            )
    names = [n.name for n in parsed[1:]]
    if len(set(names)) != len(names):
        raise ValueError(f"nodes names a peer more than once: {names}")


class ClassConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[admission.CLASS]``: one request class's share of each model (docs/scheduling.md)."""

    reserved: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.0
    """Share of each model's slots held free for this class while it runs fewer (rounded
    down; the reservations of all classes together always leave one slot shared)."""
    max_queue: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Requests of this class that may wait per model; more: 429 QUEUE_FULL. Unset: only the
    top-level ``max_queue`` holds."""
    queue_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    """Longest wait of this class for a slot: 408 QUEUE_TIMEOUT. Unset: the top-level
    ``queue_timeout_s`` (503 ALL_SLOTS_BUSY)."""


class AdmissionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[admission]``: what the gateway checks before a request reaches an engine."""

    trust_certificates: bool = True
    """Refuse (400 CAPABILITY_VERIFIED_FAILED) a request that needs a capability the model's
    certificate (``blazar model-doctor``) marks FAIL; false: send it to the engine anyway."""
    promote_after_s: Annotated[float, msgspec.Meta(gt=0.0)] | None = 30.0
    """A waiting request moves up one class per this many seconds of waiting (batch reaches
    interactive after twice that), so no class starves; a request granted so is never
    preempted. Unset: promotion by time is off (the grant-count guard still holds)."""
    preemption: bool = True
    """An interactive request may take the slot of a batch or background request that has not
    produced output yet; the preempted request queues again at the head of its class."""
    interactive: ClassConfig = ClassConfig()
    default: ClassConfig = ClassConfig()
    batch: ClassConfig = ClassConfig()
    background: ClassConfig = ClassConfig()

    def classes(self) -> tuple[ClassConfig, ClassConfig, ClassConfig, ClassConfig]:
        """The classes' settings by tier (interactive first)."""
        return (self.interactive, self.default, self.batch, self.background)


McpName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=48)]


McpCatalog = Literal["full", "compact"]
"""How a request's model sees MCP tools: every schema, or the compact catalog's meta-tools."""


class McpServer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[mcp]]`` entry: an MCP server whose tools the gateway may offer (docs/mcp.md)."""

    name: McpName
    """Lowercase letters, digits, ``-`` and ``_`` (never ``__``): tools are named ``mcp__NAME__TOOL``."""
    command: list[str] | None = None
    """stdio: the program and its arguments, started on first use."""
    env: dict[str, str] = {}
    """stdio: variables set for the program (over a small safe set: PATH, HOME, …)."""
    cwd: str | None = None
    """stdio: the program's working directory."""
    url: str | None = None
    """Streamable HTTP: the server's endpoint (``http://host:port/mcp``)."""
    headers: dict[str, str] = {}
    """Streamable HTTP: headers sent with every request (``Authorization = "Bearer …"``)."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Longest one tool call may take; past it the call is cancelled and is an error result."""
    start_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    """Longest a start (spawn or connect, initialize, list the tools) may take."""
    max_rounds: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    """Tool rounds a request may run with this server's tools before the answer is final."""
    max_output_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024
    """A tool result longer than this (UTF-8) is cut, with a note saying how much was cut."""
    approve: list[str] = []
    """Tools (their names on this server, fnmatch; ``"*"``: all) that run only when the request
    carries ``x-blazar-mcp-approve`` naming them; otherwise the call is refused to the model."""
    catalog: McpCatalog | None = None
    """How the model sees this server's tools: ``"full"`` (every schema in the prompt) or
    ``"compact"`` (three meta-tools that find, read and call them); unset: ``mcp_catalog``."""

    def __post_init__(self) -> None:
        if "__" in self.name:
            raise ValueError(f"mcp server name {self.name!r} must not contain '__' (it separates tool names)")
        if (self.command is None) == (self.url is None):
            raise ValueError(f"mcp server {self.name!r} needs exactly one of command = [...] (stdio) or url")
        if self.command is not None and not self.command:
            raise ValueError(f"mcp server {self.name!r}: command must name a program")
        if self.url is not None:
            if self.env or self.cwd is not None:
                raise ValueError(f"mcp server {self.name!r}: env and cwd are for command (stdio) servers")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"mcp server {self.name!r}: url must start with http:// or https://")
        elif self.headers:
            raise ValueError(f"mcp server {self.name!r}: headers are for url (Streamable HTTP) servers")

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


_LANE_NAMES = ("llamacpp", "mistralrs", "vllm", "sglang", "mlx", "sdcpp")
ChainName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]


class FailoverTarget(msgspec.Struct, frozen=True, kw_only=True):
    """One target of a chain, as written (``MODEL``, ``MODEL@LANE`` or ``remote:PEER/MODEL``)."""

    text: str
    model: str
    lane: str | None = None
    peer: str | None = None
    """The peer of a ``remote:`` target (the federation); None for a local one."""

    @property
    def key(self) -> str:
        """The runtime's engine key: ``MODEL`` or ``MODEL@LANE``."""
        return self.model if self.lane is None else f"{self.model}@{self.lane}"


def parse_target(text: str) -> FailoverTarget:
    """A chain target's parts; ``ValueError`` says what is wrong with it."""
    if text.startswith("remote:"):
        peer, _, model = text[len("remote:") :].partition("/")
        if not peer or not model or "@" in peer or " " in text:
            raise ValueError(f"failover target {text!r}: write remote:PEER/MODEL")
        return FailoverTarget(text=text, model=model, peer=peer)
    model, at, lane = text.partition("@")
    if not model or model != model.strip() or " " in model:
        raise ValueError(f"failover target {text!r}: write MODEL or MODEL@LANE")
    if at and lane not in _LANE_NAMES:
        raise ValueError(f"failover target {text!r}: the lane after @ is one of {', '.join(_LANE_NAMES)}")
    return FailoverTarget(text=text, model=model, lane=lane or None)


class FailoverChain(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[failover]]`` entry: a name that requests use as a model, served by the first
    healthy of its targets (docs/routing.md)."""

    name: ChainName
    """Letters, digits, ``.``, ``_``, ``-`` (no ``:``, ``@`` or ``/``): it never reads as
    ``name:tag``, a lane or a remote. Over an installed model of the same name, the chain wins."""
    targets: Annotated[list[str], msgspec.Meta(min_length=1, max_length=16)]
    """Tried in order: ``MODEL``, ``MODEL@LANE`` (that model's engine on another lane its
    ``lanes`` allow) or ``remote:PEER/MODEL`` (accepted now; skipped until the federation exists)."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """Longest a target may take to start answering (a slot, a load, the engine's response
    head) before the request moves on to the next. Unset: no limit of the chain's own."""
    bench_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """How long a target that failed is passed over; it doubles with each failure in a row."""
    bench_max_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    """The longest bench, however many failures in a row."""

    def __post_init__(self) -> None:
        parsed = [parse_target(t) for t in self.targets]
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"failover chain {self.name!r} names a target more than once")
        if any(t.peer is None and t.model == self.name for t in parsed):
            raise ValueError(f"failover chain {self.name!r} cannot be one of its own targets")
        if self.bench_max_s < self.bench_s:
            raise ValueError(f"failover chain {self.name!r}: bench_max_s must be at least bench_s")

    def parsed(self) -> list[FailoverTarget]:
        return [parse_target(t) for t in self.targets]


class Cascade(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[cascade]]`` entry: models tried cheapest first, the next one only when an
    answer fails the request's validator (docs/routing.md)."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    """What a request names as its ``model`` (or its ``cascade`` field) to run the cascade."""
    models: Annotated[list[str], msgspec.Meta(min_length=2, max_length=4)]
    """The steps, cheapest first (2 to 4)."""
    refusals: list[str] = []
    """Regular expressions (case-insensitive) that mark an answer as a refusal, which
    escalates; empty: the top-level ``cascade_refusals``."""
    judge: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    """A decision model that reads each step's answer (one that passed the other checks) and
    says yes or no to "does it answer the request?"; a no escalates. None: no judge."""
    judge_threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.5
    """The judge's probability of yes an answer needs to stand."""

    def __post_init__(self) -> None:
        for pattern in self.refusals:
            _check_pattern(pattern, f"cascade {self.name!r} refusals")


def _check_pattern(pattern: str, where: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{where}: {pattern!r} is not a regular expression ({exc})") from None


PeerName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
PoolRouter = Literal["smg"]
"""The routers a pool entry knows how to drive: SMG (``smg``, the Shepherd Model Gateway)."""
SmgPolicy = Literal[
    "random", "round_robin", "cache_aware", "power_of_two", "least_load", "consistent_hashing", "prefix_hash"
]
PoolWorkerName = Annotated[
    str, msgspec.Meta(pattern=r"^(https?://\S+|[A-Za-z0-9][^\s/]*(/[^\s/]+)*)$", max_length=300)
]
"""A worker: ``http(s)://host:port`` or an installed model's name."""


class Remote(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[remotes]]`` entry: a peer daemon (or any OpenAI-compatible server) that requests
    may be relayed to (docs/federation.md). Either ``url``, or ``dns`` with ``port``: every
    address the name resolves to is a peer, named ``NAME-ADDRESS``."""

    name: PeerName
    """What ``remote:NAME/MODEL`` and the listings call the peer (no ``/``, ``:`` or ``@``)."""
    url: str | None = None
    """The peer's base URL (``http://host:port``), without ``/v1``."""
    dns: str | None = None
    """A DNS name whose A/AAAA records are the peers (a Kubernetes headless service), or an
    SRV name (``_http._tcp.NAME``: it starts with ``_``) whose records give hosts and ports."""
    dns_server: str | None = None
    """With ``dns``: ask this nameserver (``HOST[:PORT]``) instead of the system's resolver."""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    """With ``dns``: the port the peers listen on (an SRV name's records give their own)."""
    scheme: Literal["http", "https"] = "http"
    """With ``dns``: how the peers are reached."""
    key: str | None = None
    """The key this daemon presents to the peer (``Authorization: Bearer``); a caller's key is
    never forwarded. Unset: none (a peer on loopback without keys)."""
    key_file: str | None = None
    """A file holding that key (a mounted Kubernetes Secret, say): read when the config is
    loaded, which moves its content to ``key``. At most one of ``key`` and ``key_file``."""
    tls_verify: bool = True
    """Check the peer's TLS certificate (``https``)."""
    ca_file: str | None = None
    """A PEM bundle to check the peer's certificate against, instead of the system's."""
    poll_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    """How often the peer's capacity is read; a peer that fails is polled with a backoff
    that doubles up to ``poll_max_s``."""
    poll_max_s: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """Longest a capacity poll, or the connection of a relayed request, may take."""
    resolve_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """With ``dns``: how often the name is resolved again."""
    # A pool of replicas behind a router (docs/federation.md#pools-behind-a-router)
    pool: PoolRouter | None = None
    """The peer is a router over replicas of a model (``"smg"``): requests for the pool's
    ``model`` go to it first, and its workers, with their health, are listed with it."""
    start: bool = False
    """With ``pool``: start the router here, as a supervised child on loopback (``port``, else a
    free one), instead of reaching one at ``url``; it dies with the daemon."""
    workers: Annotated[list[PoolWorkerName], msgspec.Meta(max_length=64)] = []
    """With ``pool``: the router's workers this daemon registers through the router's API: a URL
    (an OpenAI-compatible engine elsewhere) or an installed model's name (its engine here, kept
    loaded while the daemon runs, registered once ready and removed when it stops)."""
    model: str | None = None
    """With ``pool``: the model the pool serves, so requests naming it go to the router before
    this machine or another peer. Unset: the installed models named in ``workers``."""
    policy: SmgPolicy | None = None
    """With ``start``: the router's load-balancing policy. Unset: SMG's own (``cache_aware``)."""
    program: str | None = None
    """With ``start``: the ``smg`` program. Unset: the one beside this daemon's Python (the
    ``pool`` extra), else ``smg`` on PATH."""
    health_check_s: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 5
    """With ``start``: how often the router checks each worker's health (whole seconds)."""
    router_args: list[str] = []
    """With ``start``: more flags for ``smg launch`` (``["--retry-max-retries", "3"]``)."""

    def verify(self) -> bool | ssl.SSLContext:
        """How an HTTPS client checks the peer: against ``ca_file`` where it is set (as
        before httpx deprecated a path for it), else the system's certificates unless
        ``tls_verify`` is off."""
        if self.ca_file is not None:
            import ssl

            return ssl.create_default_context(cafile=self.ca_file)
        return self.tls_verify

    def __post_init__(self) -> None:
        self._check_pool()
        if self.start:
            return
        if (self.url is None) == (self.dns is None):
            raise ValueError(f"remote {self.name!r} needs exactly one of url or dns")
        if self.key is not None and self.key_file is not None:
            raise ValueError(f"remote {self.name!r}: give key or key_file, not both")
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(f"remote {self.name!r}: url must start with http:// or https://")
            if self.port is not None:
                raise ValueError(f"remote {self.name!r}: port goes with dns (put it in the url)")
        elif self.port is None and not (self.dns or "").startswith("_"):
            raise ValueError(f"remote {self.name!r}: dns needs port = the port the peers listen on")
        if self.dns_server is not None:
            if self.dns is None:
                raise ValueError(f"remote {self.name!r}: dns_server goes with dns")
            if not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(:\d{1,5})?", self.dns_server):
                raise ValueError(f"remote {self.name!r}: dns_server is HOST or HOST:PORT")
        if self.poll_max_s < self.poll_s:
            raise ValueError(f"remote {self.name!r}: poll_max_s must be at least poll_s")

    def _check_pool(self) -> None:
        where = f"remote {self.name!r}"
        if self.pool is None:
            given = [k for k, unset in _POOL_DEFAULTS.items() if getattr(self, k) != unset]
            if given:
                raise ValueError(f'{where}: {", ".join(given)}: only for a pool router (pool = "smg")')
            return
        if self.start:
            if self.url is not None or self.dns is not None:
                raise ValueError(
                    f"{where}: start = true runs the router here — drop url and dns (port picks its port)"
                )
            if self.key is not None or self.key_file is not None or self.ca_file is not None:
                raise ValueError(f"{where}: a router started here is reached on loopback without key or TLS")
        else:
            if self.dns is not None:
                raise ValueError(f"{where}: a pool router is one url, not a dns name")
            started = [
                k for k in ("policy", "program", "router_args") if getattr(self, k) != _POOL_DEFAULTS[k]
            ]
            if started:
                raise ValueError(
                    f"{where}: {', '.join(started)}: only for a router started here (start = true)"
                )
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(f"{where}: workers names a worker more than once")

    def local_workers(self) -> list[str]:
        """The installed models among ``workers`` (the others are URLs)."""
        return [w for w in self.workers if not w.startswith(("http://", "https://"))]

    def pool_models(self) -> list[str]:
        """The models whose requests go to this pool first (none unless it is a pool)."""
        if self.pool is None:
            return []
        return [self.model] if self.model is not None else self.local_workers()


_POOL_DEFAULTS: dict[str, object] = {
    "start": False,
    "workers": [],
    "model": None,
    "policy": None,
    "program": None,
    "router_args": [],
}
"""The pool keys of ``Remote`` and their defaults: any other value needs ``pool``."""


McpSelection = str | list[str]
"""``"none"``, ``"all"``, one server's name, or a list of names."""


class Tunables(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The runtime's settings a user writes in ``config.toml`` (top-level keys)."""

    slots: int = 4
    default_ctx: int = 4096
    """Per-slot context cap; the model's training context wins when smaller."""
    max_queue: int = 256
    """Requests that may wait per model; more are refused with 429 QUEUE_FULL."""
    queue_timeout_s: float = 120.0
    """Longest wait for a slot before 503 ALL_SLOTS_BUSY."""
    keep_alive_s: float = 300.0
    """Seconds a model stays loaded after its last request; negative: forever, 0: unload at once."""
    idle_sleep_s: float = 0.0
    """Seconds idle after which a loaded model's engine sleeps (llama.cpp releases the model's
    memory and its process waits on its port; the next request wakes it, reloading the model).
    0: never. The first rung of the idle ladder: ``keep_alive_s`` unloads it later."""
    max_loaded_models: int = 0
    """Models loaded at once; loading one more evicts the least recently used idle one. 0: no limit."""
    preload: list[str] = []
    """Models loaded in the background at startup (a failure is logged, not fatal)."""
    memory_budget_mb: float | None = None
    """Memory all loaded models may use together (MiB). Unset: what the system has
    available; 0: no memory check. A load that does not fit evicts idle models or is refused."""
    max_output_tokens: OutputCap | None = None
    """Output cap for requests that set none (``max_tokens``, ``num_predict``). Unset or
    0: none, a request may generate until its context is full."""
    strict: bool = False
    """Refuse, instead of adjusting and reporting, a context the model cannot serve."""
    late_chunking_max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 8192
    """Most tokens one late-chunked embeddings input may have (its chunks together); more: 413."""
    ledger_keep_requests: int = 200_000
    """Request records the ledger keeps; older ones are deleted as new ones arrive. 0: keep all."""
    jobs_max_running: Annotated[int, msgspec.Meta(ge=1)] = 2
    """Jobs (background responses, batches) that run at once; the rest wait their turn."""
    jobs_keep_s: float = 7 * 86400.0
    """How long finished jobs (and their result files) are kept; 0: forever."""
    spec: SpecSetting = "off"
    """Speculative decoding for every model without its own ``spec``: ``"off"``, ``"ngram"`` or
    ``{ngram = KIND, max = N}`` (a draft model pairs with one model: set it per model)."""
    spec_governor: bool = True
    """Turn speculation off for a model whose drafts are rarely accepted (docs/engines.md)."""
    session_bank: bool = True
    """On a graceful stop (shutdown, keep-alive unload, eviction) a llama.cpp engine saves the
    prompt cache of its warm slots under ``sessions/<model>/`` and reads them back at its next
    start at the same per-slot context, so the first request after a restart finds its prefix
    cached. False: slots start empty."""
    engine: EngineConfig = EngineConfig()
    admission: AdmissionConfig = AdmissionConfig()
    models: dict[str, ModelOverride] = {}
    mcp: list[McpServer] = []
    """MCP servers (``[[mcp]]`` entries), each started on first use (docs/mcp.md)."""
    mcp_default: McpSelection = "none"
    """The servers whose tools a request gets when it names none: ``"none"``, ``"all"``,
    a name or a list of names."""
    mcp_catalog: McpCatalog = "full"
    """The catalog of ``[[mcp]]`` servers without their own ``catalog`` (docs/mcp.md)."""
    failover: list[FailoverChain] = []
    """Failover chains (``[[failover]]`` entries): a model name served by the first healthy
    of several targets (docs/routing.md)."""
    cascade: list[Cascade] = []
    """Cascades (``[[cascade]]`` entries): cheap models first, escalation on a failed answer."""
    cascade_refusals: list[str] = []
    """Refusal patterns (regular expressions, case-insensitive) for cascades without their own."""
    best_of_judge: str | None = None
    """A decision model that picks among a chat ``best_of``'s valid candidates: the one it
    finds likeliest to answer the request correctly and completely; None: the usual rule."""
    remotes: list[Remote] = []
    """Peers (``[[remotes]]`` entries) requests may be relayed to (docs/federation.md); none:
    nothing ever leaves this machine."""

    def __post_init__(self) -> None:
        if isinstance(self.spec, Speculation) and self.spec.draft is not None:
            raise ValueError(
                "spec: a draft model pairs with one model — write it under "
                '[models."NAME"] spec = {draft = ...}'
            )
        _check_chains(self.failover)
        peers = [r.name for r in self.remotes]
        if len(set(peers)) != len(peers):
            twice = sorted({n for n in peers if peers.count(n) > 1})
            raise ValueError(f"remote names must be unique; given more than once: {', '.join(twice)}")
        cascades = [c.name for c in self.cascade]
        if len(set(cascades)) != len(cascades):
            raise ValueError(f"cascade names must be unique; given more than once: {sorted(cascades)}")
        for pattern in self.cascade_refusals:
            _check_pattern(pattern, "cascade_refusals")
        clash = sorted({c.name for c in self.cascade} & {f.name for f in self.failover})
        if clash:
            raise ValueError(f"{', '.join(clash)}: both a [[cascade]] and a [[failover]] chain — rename one")
        names = [server.name for server in self.mcp]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"mcp server names must be unique; given more than once: {', '.join(twice)}")
        chosen = [self.mcp_default] if isinstance(self.mcp_default, str) else self.mcp_default
        if isinstance(self.mcp_default, str) and self.mcp_default in ("none", "all"):
            chosen = []
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise ValueError(
                f"mcp_default names {', '.join(map(repr, unknown))}, which no [[mcp]] entry defines "
                '(write "none", "all", or names of [[mcp]] entries)'
            )


def _check_chains(chains: list[FailoverChain]) -> None:
    names = [c.name for c in chains]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"failover chain names must be unique; given more than once: {', '.join(twice)}")
    for chain in chains:
        nested = [t.text for t in chain.parsed() if t.peer is None and t.model in names]
        if nested:
            raise ValueError(
                f"failover chain {chain.name!r} names the chain {nested[0]!r} as a target: "
                "chains do not nest — list that chain's targets instead"
            )


class RuntimeConfig(Tunables, frozen=True, kw_only=True, forbid_unknown_fields=True):
    home: str
    """Data root: ``models/`` lives below it."""
    run_dir: str
    """Pid files of engine children (for reaping after a crash)."""
    cache_dir: str
    """Downloaded wheels and other re-fetchable files."""
    configured: frozenset[str] = frozenset()
    """The keys config.toml sets (``slots``, ``engine.threads``), so that ``blazar explain``
    tells a value written there from a built-in default; empty for an embedder's config."""
    profiles: dict[str, Profile] = {}
    """Each model's tuned profile (``blazar tune``), read from the ledger at start."""

    @classmethod
    def in_home(cls, home: str, **settings: object) -> RuntimeConfig:
        """A config with every path under ``home`` (as ``BLAZAR_HOME`` lays them out) and
        the given settings, for a program that embeds the runtime."""
        paths = cls(home=home, run_dir=f"{home}/run", cache_dir=f"{home}/cache")
        return msgspec.structs.replace(paths, **settings)

    @property
    def models_dir(self) -> str:
        return f"{self.home}/models"
