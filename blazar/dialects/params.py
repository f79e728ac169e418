"""What the daemon does with each request parameter, per dialect and route: pure data.

Every parameter of a dialect's inference routes is one of:

* ``honoured``: it has the effect the dialect defines;
* ``changed``: honoured, but the daemon may lower it (an output limit capped to the
  context, a context clamped to what the model serves); when it does, the response
  names it in ``X-Blazar-Changed``;
* ``ignored``: accepted without effect; a request that sets it (to anything but an
  ``inert`` value) gets its name in ``X-Blazar-Ignored``;
* ``refused``: the request is answered ``400`` naming it (unless the value is inert).

Strict mode turns ignored and changed parameters into refusals too (``blazar.serve.policy.honesty``).
``docs/api.md`` carries the same tables; a test keeps the two in step.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from blazar.dialects.neutral import DecodeError

__all__ = [
    "ANTHROPIC_MESSAGES",
    "IMAGE_EDITS",
    "IMAGE_GENERATIONS",
    "IMAGE_UPSCALE",
    "IMAGE_VARIATIONS",
    "OLLAMA_CHAT",
    "OLLAMA_EMBED",
    "OLLAMA_EMBEDDINGS",
    "OLLAMA_GENERATE",
    "OLLAMA_RERANK",
    "OPENAI_CHAT",
    "OPENAI_COMPLETIONS",
    "OPENAI_EMBEDDINGS",
    "RERANK",
    "RESPONSES",
    "TABLES",
    "VIDEOS",
    "Param",
    "Table",
    "Treatment",
    "keys_of",
]


class Treatment(enum.StrEnum):
    HONOURED = "honoured"
    CHANGED = "changed"
    IGNORED = "ignored"
    REFUSED = "refused"


class Param(msgspec.Struct, frozen=True):
    name: str
    """The wire path: ``logit_bias``, ``options.mirostat``, ``thinking.budget_tokens``."""
    treatment: Treatment
    note: str = ""
    """What happens, in a few words (docs/api.md says the same)."""
    inert: tuple[Any, ...] = ()
    """Values that ask for nothing (``n: 1``, ``store: false``): never reported nor refused."""
    relayed_only: bool = False
    """Honoured when the body is relayed to llama.cpp as is, dropped when it is translated."""


class Table:
    """One route's parameters. ``open`` names the objects whose every key is a parameter
    (``""``: the body itself, ``"options"``): a key of theirs that the table does not
    list is reported as ignored."""

    def __init__(
        self, dialect: str, route: str, params: Iterable[Param], *, open: Iterable[str] = ()
    ) -> None:
        self.dialect = dialect
        self.route = route
        self.params = {p.name: p for p in params}
        self.open = tuple(open)
        watched = [p for p in self.params.values() if p.treatment in (Treatment.IGNORED, Treatment.REFUSED)]
        self._top = tuple((p.name, p) for p in watched if "." not in p.name)
        self._nested = tuple((p, tuple(p.name.split("."))) for p in watched if "." in p.name)

    def __getitem__(self, name: str) -> Param:
        return self.params[name]

    def screen(self, wire: Any) -> list[str]:
        """The ignored parameters ``wire`` (a decoded struct, or a dict) sets; raises
        ``DecodeError`` naming the first refused one. Cheap: one attribute look-up per
        ignored or refused parameter of the table."""
        if isinstance(wire, dict):
            found = [(p, wire.get(name)) for name, p in self._top if wire.get(name) is not None]
        else:  # the hot path: a struct's attributes, most of them None
            found = [(p, v) for name, p in self._top if (v := getattr(wire, name, None)) is not None]
        for param, parts in self._nested:
            value = wire
            for part in parts:
                value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
                if value is None:
                    break
            if value is not None:
                found.append((param, value))
        out: list[str] = []
        for param, value in found:
            if param.inert and value in param.inert:
                continue
            if param.treatment is Treatment.REFUSED:
                raise DecodeError(f"invalid field `{param.name}`: {param.note}", param=param.name)
            out.append(param.name)
        return out

    def unlisted(self, keys: Mapping[str, Iterable[str]]) -> list[str]:
        """The keys of this table's open objects (``keys_of``) that it does not list:
        accepted, and without effect."""
        out: list[str] = []
        for obj in self.open:
            prefix = f"{obj}." if obj else ""
            out += [prefix + k for k in keys.get(obj, ()) if prefix + k not in self.params]
        return out

    def dropped_when_translated(self, keys: Iterable[str]) -> list[str]:
        """Of a relayed route's top-level ``keys``, those a translation drops: the ones
        honoured only when relayed, and any the table does not know (passed to llama.cpp
        when relayed, which may honour them)."""
        out = []
        for k in keys:
            p = self.params.get(k)
            if p is None or p.relayed_only:
                out.append(k)
        return out


class _Keys(msgspec.Struct):
    options: dict[str, msgspec.Raw] | None = None


def keys_of(body: bytes, objects: Iterable[str]) -> dict[str, list[str]]:
    """The keys of ``objects`` (``""``: the body, ``"options"``) in a JSON body already
    known to decode; values are skipped, not parsed."""
    top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    out: dict[str, list[str]] = {}
    for obj in objects:
        if not obj:
            out[""] = list(top)
        elif (raw := top.get(obj)) is not None:
            inner = msgspec.json.decode(raw)
            out[obj] = list(inner) if isinstance(inner, dict) else []
    return out


def _p(name: str, treatment: Treatment, note: str = "", **kw: Any) -> Param:
    return Param(name, treatment, note, **kw)


H, C, IGN, R = Treatment.HONOURED, Treatment.CHANGED, Treatment.IGNORED, Treatment.REFUSED

_CONTEXT_CAP = "above the per-slot context: capped to it (the prompt takes its share of that too)"
_LLAMA_EXTRAS = (
    "top_k",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dynatemp_range",
    "dynatemp_exponent",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "top_n_sigma",
    "samplers",
    "grammar",
    "json_schema",
    "n_probs",
    "n_keep",
    "ignore_eos",
    "cache_prompt",
    "id_slot",
    "chat_template_kwargs",
    "reasoning_format",
)
"""llama.cpp's own request fields, relayed untouched on the OpenAI routes."""

_RELAYED = "llama.cpp extension, relayed untouched"
_EFFORT = "`none` turns thinking off, a level turns it on, see thinking; named where the model cannot think"
_LORA = "the model's LoRA adapters' scales for this request, by `id` or `name` (see models)"
_N_PREDICT = "llama.cpp's own output limit, which wins over `max_tokens`"
_USER = "used by OpenAI for abuse monitoring; nothing to do here"


def _llama_extras() -> list[Param]:
    return [_p(k, H, _RELAYED, relayed_only=True) for k in _LLAMA_EXTRAS]


OPENAI_CHAT = Table(
    "openai",
    "/v1/chat/completions",
    [
        _p("model", H),
        _p("mcp", H, "MCP servers whose tools the gateway runs, see MCP"),
        _p("messages", H),
        _p("stream", H),
        _p("stream_options", H, "`include_usage`"),
        _p("max_tokens", C, _CONTEXT_CAP),
        _p("max_completion_tokens", C, _CONTEXT_CAP),
        _p("temperature", H),
        _p("top_p", H),
        _p("seed", H),
        _p("stop", H),
        _p("presence_penalty", H),
        _p("frequency_penalty", H),
        _p("tools", H, "native or emulated, see tool calling"),
        _p("tool_choice", H),
        _p("response_format", H, "text, json_object or json_schema (a grammar)"),
        _p("logit_bias", H, "by llama.cpp", relayed_only=True),
        _p("logprobs", H, "by llama.cpp", relayed_only=True),
        _p("top_logprobs", H, "by llama.cpp", relayed_only=True),
        _p("parallel_tool_calls", H, "by llama.cpp", relayed_only=True),
        _p("reasoning_effort", H, _EFFORT),
        _p("n_predict", H, _N_PREDICT, relayed_only=True),
        _p("lora", H, _LORA, relayed_only=True),
        *_llama_extras(),
        _p("n", H, "1 to 8 choices, each its own sample and admission slot; not with `stream`, see routing"),
        _p("best_of", H, "2 to 4 candidates, the best one answers; not with `stream`, see routing"),
        _p("cascade", H, "models tried cheapest first, see routing"),
        _p(
            "modalities",
            R,
            'only text output is available: send `modalities: ["text"]` or leave it out',
            inert=(["text"],),
        ),
        _p("audio", R, "audio output is not available: leave out `audio`"),
        _p(
            "web_search_options",
            R,
            "web search is not available: nothing leaves this machine — leave out `web_search_options`",
        ),
        _p("user", IGN, _USER),
        _p("safety_identifier", IGN, _USER),
        _p("store", H, "`true` keeps the completion, see stored chat completions"),
        _p("metadata", IGN, "kept only with `store: true`: see stored chat completions"),
        _p("service_tier", IGN, "there is one tier; admission has its own priorities"),
        _p("prediction", IGN, "predicted outputs are not used"),
        _p("verbosity", IGN, "no model here reads it"),
        _p("prompt_cache_key", IGN, "llama.cpp reuses cached prefixes on its own"),
        _p("prompt_cache_retention", IGN, "llama.cpp reuses cached prefixes on its own"),
        _p("functions", IGN, "deprecated by OpenAI: send `tools`"),
        _p("function_call", IGN, "deprecated by OpenAI: send `tool_choice`"),
    ],
)

OPENAI_COMPLETIONS = Table(
    "openai",
    "/v1/completions",
    [
        _p("model", H),
        _p("prompt", H),
        _p("stream", H),
        _p("stream_options", H, "`include_usage`"),
        _p("max_tokens", C, _CONTEXT_CAP),
        _p("temperature", H),
        _p("top_p", H),
        _p("seed", H),
        _p("stop", H),
        _p("presence_penalty", H),
        _p("frequency_penalty", H),
        _p("logit_bias", H, "by llama.cpp"),
        _p("logprobs", H, "by llama.cpp (`n_probs`)"),
        _p("n_predict", H, _N_PREDICT, relayed_only=True),
        _p("lora", H, _LORA, relayed_only=True),
        *_llama_extras(),
        _p("n", H, "1 to 8 choices, each its own sample and admission slot; not with `stream`, see routing"),
        _p("best_of", H, "candidates (up to 4, at least `n`), the likeliest `n` answer; not with `stream`"),
        _p("echo", R, "Only no echo is supported: leave out `echo`", inert=(False,)),
        _p(
            "suffix",
            R,
            "Unsupported param: suffix — for fill-in-the-middle use `POST /infill` or Ollama's "
            "`/api/generate`",
            inert=("",),
        ),
        _p("user", IGN, _USER),
    ],
)

OPENAI_EMBEDDINGS = Table(
    "openai",
    "/v1/embeddings",
    [
        _p("model", H),
        _p("input", H, "strings or token arrays, all in one engine call"),
        _p("encoding_format", H, "float or base64"),
        _p("dimensions", H, "the vector is cut to this length and normalised again"),
        _p("late_chunking", H, "`input` is one text's chunks, embedded together (Blazar's)"),
        _p("user", IGN, _USER),
    ],
)

_RANKED = "a document is ranked whole, up to the context: a longer one is refused"

RERANK = Table(
    "openai",
    "/v1/rerank",
    [
        _p("model", H),
        _p("query", H),
        _p("documents", H, "strings, or objects whose `text` is ranked"),
        _p("top_n", H, "the best N; all when unset"),
        _p("return_documents", H, "default true (Jina's default)"),
        _p("rank_fields", IGN, "only `text` is ranked"),
        _p("max_chunks_per_doc", IGN, _RANKED),
        _p("max_tokens_per_doc", IGN, _RANKED),
        _p("user", IGN, _USER),
    ],
)

_LOAD_TIME = "the engine's placement is Blazar's (see `blazar plan`), not a request's"


def _ollama_options(*, sampling: bool) -> list[Param]:
    if not sampling:
        return []
    return [
        _p("options.num_predict", C, "output limit; " + _CONTEXT_CAP),
        _p("options.num_ctx", C, "clamped to what the model can serve (strict: `CONTEXT_TOO_LARGE`)"),
        _p("options.temperature", H),
        _p("options.top_p", H),
        _p("options.top_k", H),
        _p("options.min_p", H),
        _p("options.typical_p", H),
        _p("options.seed", H),
        _p("options.stop", H),
        _p("options.repeat_penalty", H),
        _p("options.repeat_last_n", H),
        _p("options.presence_penalty", H),
        _p("options.frequency_penalty", H),
        _p("options.mirostat", H),
        _p("options.mirostat_tau", H),
        _p("options.mirostat_eta", H),
        _p("options.num_keep", H, "llama.cpp's `n_keep`"),
        _p("options.lora", H, _LORA),
        _p("options.penalize_newline", IGN, "removed from llama.cpp"),
        _p("options.tfs_z", IGN, "removed from llama.cpp"),
        *[
            _p(f"options.{k}", IGN, _LOAD_TIME)
            for k in (
                "num_batch",
                "num_gpu",
                "main_gpu",
                "num_thread",
                "use_mmap",
                "use_mlock",
                "numa",
                "low_vram",
                "f16_kv",
                "vocab_only",
            )
        ],
    ]


_KEEP_ALIVE = "seconds or a duration; 0 unloads"
_THINK = "`true`/`false` switch thinking; the levels `high`, `medium`, `low` turn it on, see thinking"

OLLAMA_CHAT = Table(
    "ollama",
    "/api/chat",
    [
        _p("model", H),
        _p("mcp", H, "MCP servers whose tools the gateway runs, see MCP"),
        _p("best_of", H, "2 to 4 candidates, the best one answers; not with `stream`, see routing"),
        _p("cascade", H, "models tried cheapest first, see routing"),
        _p("messages", H, "none: load (or unload) only"),
        _p("stream", H),
        _p("format", H, '`"json"` or a JSON schema (a grammar)'),
        _p("tools", H),
        _p("think", H, _THINK),
        _p("keep_alive", H, _KEEP_ALIVE),
        _p("options", H, "the keys below; any other key is ignored"),
        *_ollama_options(sampling=True),
    ],
    open=("", "options"),
)

OLLAMA_GENERATE = Table(
    "ollama",
    "/api/generate",
    [
        _p("model", H),
        _p("prompt", H, "empty: load (or unload) only"),
        _p("system", H),
        _p("raw", H),
        _p("images", H, "needs a vision projector"),
        _p("stream", H),
        _p("format", H, '`"json"` or a JSON schema (a grammar)'),
        _p("think", H, _THINK),
        _p("keep_alive", H, _KEEP_ALIVE),
        _p("options", H, "the keys below; any other key is ignored"),
        *_ollama_options(sampling=True),
        _p(
            "suffix",
            H,
            "fill in the middle on the engine's `/infill` (a model with FIM tokens); `system`, "
            "`format` and `think` are then ignored",
        ),
        _p("template", IGN, "the model's own chat template is always used", inert=("",)),
        _p(
            "context",
            IGN,
            "the token context of an earlier answer is not reused: send the history",
            inert=([],),
        ),
    ],
    open=("", "options"),
)

OLLAMA_EMBED = Table(
    "ollama",
    "/api/embed",
    [
        _p("model", H),
        _p("input", H),
        _p("dimensions", H, "the vector is cut to this length and normalised again"),
        _p("late_chunking", H, "`input` is one text's chunks, embedded together (Blazar's)"),
        _p("keep_alive", H, _KEEP_ALIVE),
        _p("truncate", IGN, "inputs are not cut to the context: a longer one is refused", inert=(False,)),
        _p("options", IGN, "no option applies to embeddings", inert=({},)),
    ],
    open=("",),
)

OLLAMA_RERANK = Table(
    "ollama",
    "/api/rerank",
    [
        _p("model", H),
        _p("query", H),
        _p("documents", H, "strings, or objects whose `text` is ranked"),
        _p("top_n", H, "the best N; all when unset"),
        _p("return_documents", H, "default true"),
        _p("keep_alive", H, _KEEP_ALIVE),
        _p("options", IGN, "no option applies to reranking", inert=({},)),
    ],
    open=("",),
)

OLLAMA_EMBEDDINGS = Table(
    "ollama",
    "/api/embeddings",
    [
        _p("model", H),
        _p("prompt", H, "empty: load only"),
        _p("keep_alive", H, _KEEP_ALIVE),
        _p("options", IGN, "no option applies to embeddings", inert=({},)),
    ],
    open=("",),
)

ANTHROPIC_MESSAGES = Table(
    "anthropic",
    "/v1/messages",
    [
        _p("model", H),
        _p("mcp", H, "MCP servers whose tools the gateway runs, see MCP"),
        _p("best_of", H, "2 to 4 candidates, the best one answers; not with `stream`, see routing"),
        _p("cascade", H, "models tried cheapest first, see routing"),
        _p("messages", H),
        _p("max_tokens", C, _CONTEXT_CAP),
        _p("system", H),
        _p("stop_sequences", H),
        _p("temperature", H),
        _p("top_p", H),
        _p("top_k", H),
        _p("stream", H),
        _p("tools", H),
        _p("tool_choice", H),
        _p("thinking", H, "`enabled`/`adaptive` turn thinking on, `disabled` off, see thinking"),
        _p("output_config", H, "`format` (a JSON schema, as a grammar); `effort`: the thinking level"),
        _p("thinking.budget_tokens", H, "the engine ends the reasoning after this many tokens"),
        _p("thinking.display", IGN, "reasoning is shown whenever thinking is on", inert=("summarized",)),
        _p(
            "tool_choice.disable_parallel_tool_use",
            IGN,
            "several calls in one turn are not prevented",
            inert=(False,),
        ),
        _p("metadata", IGN, "`user_id` is for Anthropic's abuse monitoring"),
        _p("service_tier", IGN, "there is one tier; admission has its own priorities"),
        _p("container", IGN, "no code-execution containers here"),
        _p("context_management", IGN, "the context is not edited: an overflow is refused"),
        _p("mcp_servers", IGN, "remote MCP servers are not called"),
        _p("inference_geo", IGN, "every request runs on this machine"),
    ],
    open=("",),
)

RESPONSES = Table(
    "openai",
    "/v1/responses",
    [
        _p("model", H),
        _p("mcp", H, "MCP servers whose tools the gateway runs, see MCP"),
        _p("best_of", H, "2 to 4 candidates, the best one answers; not with `stream`, see routing"),
        _p("cascade", H, "models tried cheapest first, see routing"),
        _p("input", H),
        _p("instructions", H),
        _p("tools", H, "function and namespace tools"),
        _p("tool_choice", H),
        _p("text", H, "`format`"),
        _p("reasoning", H, "`effort`: `none` turns thinking off, a level turns it on, see thinking"),
        _p("max_output_tokens", C, _CONTEXT_CAP),
        _p("temperature", H),
        _p("top_p", H),
        _p("seed", H, "not in OpenAI's reference; llama.cpp honours it"),
        _p("metadata", H, "stored and echoed"),
        _p("store", H),
        _p("previous_response_id", H),
        _p("conversation", H),
        _p("background", H),
        _p("stream", H),
        _p("include", IGN, "none of the values can be produced; each is named as `include:NAME`"),
        _p("reasoning.summary", IGN, "summaries cannot be produced"),
        _p("reasoning.generate_summary", IGN, "summaries cannot be produced"),
        _p("top_logprobs", IGN, "no logprobs in this dialect", inert=(0,)),
        _p("max_tool_calls", IGN, "not enforced"),
        _p("parallel_tool_calls", IGN, "`false` is not enforced", inert=(True,)),
        _p("truncation", IGN, "`auto` is not done: an overflow is refused", inert=("disabled",)),
        _p("text.verbosity", IGN, "no model here reads it"),
        _p("user", IGN, _USER),
        _p("safety_identifier", IGN, _USER),
        _p("service_tier", IGN, "there is one tier; admission has its own priorities"),
        _p("prompt_cache_key", IGN, "llama.cpp reuses cached prefixes on its own"),
        _p("prompt_cache_retention", IGN, "llama.cpp reuses cached prefixes on its own"),
        _p("stream_options", IGN, "no obfuscation padding is added"),
        _p(
            "prompt",
            R,
            "reusable prompts live on OpenAI's platform: send `instructions` and `input` instead",
        ),
    ],
)


_SIZE = "`WIDTHxHEIGHT`, 64 to 4096 a side; `auto`: the model's default"
_RESPONSE_FORMAT = "`b64_json` (the default) or `url` (the daemon serves the file for an hour)"
_N_IMAGES = "1 to 8 (stable-diffusion.cpp makes at most 8 at once)"
_NO_STREAM = "partial images are not streamed: leave out `stream`"
_STEPS = "the model's own sampling steps decide the quality"
_OPAQUE = "stable-diffusion.cpp draws opaque images"
_NO_FILTER = "no content filter runs here"
_OFF = (False, "false", "0")


def _image_common(output_formats: str) -> list[Param]:
    return [
        _p("n", H, _N_IMAGES),
        _p("size", H, _SIZE),
        _p("response_format", H, _RESPONSE_FORMAT),
        _p("output_format", H, output_formats),
        _p("output_compression", H, "0 to 100, for jpeg and webp"),
        _p("quality", IGN, _STEPS, inert=("auto",)),
        _p("background", IGN, _OPAQUE, inert=("auto", "opaque")),
        _p("moderation", IGN, _NO_FILTER, inert=("low",)),
        _p("partial_images", IGN, "nothing is streamed", inert=(0, "0")),
        _p("stream", R, _NO_STREAM, inert=_OFF),
        _p("user", IGN, _USER),
    ]


IMAGE_GENERATIONS = Table(
    "openai",
    "/v1/images/generations",
    [
        _p("model", H),
        _p("prompt", H, "required"),
        *_image_common("`png` (the default), `jpeg` or `webp`"),
        _p("style", IGN, "a DALL-E 3 setting; the prompt decides the style"),
    ],
    open=("",),
)

IMAGE_EDITS = Table(
    "openai",
    "/v1/images/edits",
    [
        _p("model", H),
        _p("prompt", H, "required"),
        *_image_common("`png` (the default) or `jpeg`"),
        _p(
            "image",
            H,
            "PNG, JPEG or WebP files (`image` or `image[]`); the first is edited, all are references",
        ),
        _p("mask", H, "a PNG of the first image's size; stable-diffusion.cpp redraws its white areas"),
        _p("input_fidelity", IGN, "the model's own image conditioning decides it"),
    ],
    open=("",),
)

IMAGE_VARIATIONS = Table(
    "openai",
    "/v1/images/variations",
    [
        _p("model", H),
        _p("image", H, "one PNG, JPEG or WebP file"),
        _p("n", H, _N_IMAGES),
        _p("size", H, _SIZE),
        _p("response_format", H, _RESPONSE_FORMAT),
        _p("user", IGN, _USER),
    ],
    open=("",),
)

IMAGE_UPSCALE = Table(
    "openai",
    "/v1/images/upscale",
    [
        _p("model", H),
        _p("image", H, "one PNG, JPEG or WebP file"),
        _p(
            "upscaler",
            H,
            "`Lanczos`, `Nearest`, `Latent`…, or a model in sd-server's `--hires-upscalers-dir`",
        ),
        _p("scale", H, "the factor, above 1 and at most 4 (default 2)"),
        _p("tile_size", H, "the upscaler model's tile, in pixels"),
        _p("denoising_strength", H, "how much the refining pass may change, above 0 and at most 1"),
        _p("output_format", H, "`png` (the default), `jpeg` or `webp`"),
        _p("response_format", H, _RESPONSE_FORMAT),
        _p("repeats", R, "stable-diffusion.cpp's server upscales once: send `scale` instead", inert=(1, "1")),
    ],
    open=("",),
)

VIDEOS = Table(
    "openai",
    "/v1/videos",
    [
        _p("model", H),
        _p("prompt", H, "required"),
        _p("seconds", H, "1 to 20: seconds times fps, plus one, frames (sd-server keeps 4n + 1)"),
        _p("size", H, _SIZE),
        _p("input_reference", H, "a PNG, JPEG or WebP image: the first frame"),
        _p("fps", H, "Blazar's: 1 to 60 (default 16)"),
        _p("video_frames", H, "Blazar's: the frame count instead of `seconds` (4n + 1 are kept)"),
        _p("output_format", H, "Blazar's: `webm` (the default), `webp` or `avi`"),
        _p("remix_video_id", R, "remixing a video is not served here — describe it anew"),
    ],
    open=("",),
)

TABLES: tuple[Table, ...] = (
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    RERANK,
    RESPONSES,
    OLLAMA_CHAT,
    OLLAMA_GENERATE,
    OLLAMA_EMBED,
    OLLAMA_EMBEDDINGS,
    OLLAMA_RERANK,
    ANTHROPIC_MESSAGES,
    IMAGE_GENERATIONS,
    IMAGE_EDITS,
    IMAGE_VARIATIONS,
    IMAGE_UPSCALE,
    VIDEOS,
)
"""Every inference route's table (docs/api.md has one for each)."""
