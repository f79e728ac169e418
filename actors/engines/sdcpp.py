"""The stable-diffusion.cpp lane: ``sd-server`` for a diffusion checkpoint.

The program is a configured path, else ``sd-server`` on ``PATH``. (The
``stable-diffusion-cpp-python`` bindings build the C++ library from source at
install, so no host on them ships here.) It runs under our watchdog.

Of the ``LaunchSpec`` it reads the checkpoint path, ``threads``, ``extra_args``, the
model's ``architecture`` and its ``diffusion`` settings (mapped by ``options``).
A full checkpoint (UNet or DiT with its text encoders and VAE in one file) is given
with ``-m``; a standalone diffusion model (a Flux or SD3 transformer alone) with
``--diffusion-model``, beside its ``components`` (``vae``, ``clip_l``, ``clip_g``,
``t5xxl``, ``llm``). Offloading to the CPU, flash attention, VAE tiling and a weight
type come from the model's settings; an upscalers folder is a keyword of ``build_argv``.

API mapping (``blazar/web/routes/openai/images.py``). ``POST /v1/images/generations`` (JSON) and
``POST /v1/images/edits`` (multipart: ``image[]``, optional ``mask``) are OpenAI's and are
relayed with the fields sd-server reads; replies are always ``b64_json`` (the gateway
keeps the image and answers a URL for ``response_format=url``). Its errors are
``{"error": "text"}``, rewritten into OpenAI's shape. Variations and upscales have no
OpenAI route there; its WebUI ``/sdapi/v1/img2img`` refuses an empty prompt, so both are
jobs of its native API, ``POST /sdcpp/v1/img_gen`` (the image as ``init_image``; an
upscale turns on the ``hires`` pass, with upscaler models from ``--hires-upscalers-dir``),
polled at ``GET /sdcpp/v1/jobs/{id}``. Video models (Wan) take ``POST /sdcpp/v1/vid_gen``,
the same kind of job, which ``POST /v1/videos`` runs as a durable job of the daemon's
(``blazar/serve/jobs/video.py``).

The server checks no API key and generates one image request at a time (the others
wait inside it). It loads the model before it listens, so its first answer on
``GET /v1/models`` means it is ready: it has no ``/health``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any, Literal

from actors.config import EngineConfig
from actors.engines._gpu import ApiMap, Program, gpu_lane, watched
from actors.engines.lane import Lane
from actors.engines.spec import LaunchSpec

__all__ = [
    "API",
    "CAPABILITIES",
    "COMPONENTS",
    "FORMATS",
    "LANE",
    "build_argv",
    "find_sd_server",
    "lane",
    "options",
    "role_for",
]

LANE = "stable-diffusion.cpp"

FORMATS = frozenset({"diffusion"})
"""A diffusion checkpoint: ``.safetensors``, ``.ckpt`` or a GGUF of one (``registry.formats``)."""

CAPABILITIES = frozenset({"images"})
"""Image generation, edits (inpainting with a mask), variations (translated), upscale
(hires pass) and video (video models); no text."""

COMPONENTS = ("vae", "clip_l", "clip_g", "t5xxl", "llm")
"""Companion files a standalone diffusion model needs, by sd-server's flag names."""

API = ApiMap(
    health="/v1/models",
    relay=("/v1/images/generations", "/v1/images/edits"),
    translate=(
        "response_format url: the gateway stores the b64_json image and answers with its URL",
        "POST /v1/images/variations -> POST /sdcpp/v1/img_gen (init_image; GET /sdcpp/v1/jobs/{id})",
        "POST /v1/images/upscale -> POST /sdcpp/v1/img_gen with hires (GET /sdcpp/v1/jobs/{id})",
        "POST /v1/videos -> a daemon job running POST /sdcpp/v1/vid_gen (GET /sdcpp/v1/jobs/{id})",
    ),
    checks_api_key=False,
    names_model=False,
)

_STANDALONE = frozenset({"flux", "sd3", "dit"})


def role_for(architecture: str | None, *, has_components: bool) -> Literal["model", "diffusion-model"]:
    """``-m`` for a full checkpoint; ``--diffusion-model`` for a transformer given alone
    with its components (a Flux or SD3 file beside a VAE and text encoders)."""
    if has_components and (architecture or "") in _STANDALONE:
        return "diffusion-model"
    return "model"


def find_sd_server(configured: str | None) -> Program | None:
    if configured:
        return Program(argv=[configured], found="configured", dist="")
    found = shutil.which("sd-server")
    return Program(argv=[found], found="path", dist="") if found else None


def build_argv(
    spec: LaunchSpec,
    *,
    port: int,
    api_key: str,
    program: Program,
    role: Literal["model", "diffusion-model"] = "model",
    components: Mapping[str, str] | None = None,
    offload_to_cpu: bool = False,
    flash_attention: bool = False,
    vae_tiling: bool = False,
    weight_type: str | None = None,
    upscalers_dir: str | None = None,
) -> list[str]:
    """``api_key`` is not passed: sd-server has no such option. ``weight_type`` converts the
    weights at load (``q8_0``, ``f16``…); ``offload_to_cpu`` keeps them in RAM and moves
    each part to the GPU when it runs (for a model larger than the GPU's free memory)."""
    flags = [
        "--listen-ip", "127.0.0.1",
        "--listen-port", str(port),
        "-m" if role == "model" else "--diffusion-model", spec.path,
    ]  # fmt: skip
    for name, path in (components or {}).items():
        if name not in COMPONENTS:
            raise ValueError(f"unknown sd-server component {name!r} (one of {', '.join(COMPONENTS)})")
        flags += [f"--{name}", path]
    if spec.threads:
        flags += ["-t", str(spec.threads)]
    if weight_type:
        flags += ["--type", weight_type]
    if offload_to_cpu:
        flags.append("--offload-to-cpu")
    if flash_attention:
        flags.append("--diffusion-fa")
    if vae_tiling:
        flags.append("--vae-tiling")
    if upscalers_dir:
        flags += ["--hires-upscalers-dir", upscalers_dir]
    flags += spec.extra_args
    return watched(program, flags)


def options(spec: LaunchSpec) -> dict[str, Any]:
    """``build_argv``'s settings from the spec's diffusion settings and the model's family."""
    d = spec.diffusion
    return {
        "role": role_for(spec.architecture, has_components=bool(d.components)),
        "components": d.components,
        "offload_to_cpu": d.offload_to_cpu,
        "flash_attention": d.flash_attention,
        "vae_tiling": d.vae_tiling,
        "weight_type": d.weight_type,
    }


def lane(config: EngineConfig, path: str | None = None) -> Lane | None:
    """The stable-diffusion.cpp lane, with ``sd-server`` at ``path`` (``[engine] sd_server``)
    or on ``PATH``; None when there is none."""
    return gpu_lane(
        find_sd_server(path),
        name=LANE,
        kind="sd-server",
        label="stable-diffusion.cpp",
        build=build_argv,
        api=API,
        capabilities=CAPABILITIES,
        formats=FORMATS,
        options=options,
        sequences=1,  # one image at a time: the others would hold slots while they wait inside it
    )
