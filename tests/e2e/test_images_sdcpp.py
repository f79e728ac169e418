"""The image routes through the real daemon and a real ``sd-server``, with the official
``openai`` client: generation (base64 and URL), an edit with a mask, a variation and an
upscale, each answered in OpenAI's shape with images of the size asked for.

It runs where stable-diffusion.cpp's server and a checkpoint exist:

* ``sd-server`` on ``PATH``, or its path in ``BLAZAR_SD_SERVER``;
* ``BLAZAR_TEST_SD_MODEL``: a full checkpoint that ``sd-server -m FILE`` loads (an SD 1.5
  or SDXL-Turbo ``.safetensors`` or GGUF; small ones keep the test short);
* optionally ``BLAZAR_TEST_SD_SIZE`` (default 256): the side of the images asked for.

Elsewhere it skips with the reason. Generation on a CPU takes minutes an image, so
the client waits up to 30 minutes per request."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from blazar.dialects.images import image_info
from registry.store import Store
from tests.blazar.test_images_dialect import png
from tests.blazar.test_images_gateway import add_image_model
from tests.support import DaemonProc, start_daemon

pytestmark = pytest.mark.slow

MODEL = "sd-test"
SIDE = int(os.environ.get("BLAZAR_TEST_SD_SIZE", "256"))


def _requirements() -> tuple[str, Path]:
    server = os.environ.get("BLAZAR_SD_SERVER") or shutil.which("sd-server")
    if not server:
        pytest.skip(
            "sd-server is not installed here: build stable-diffusion.cpp's server and put it on PATH, "
            "or name it in BLAZAR_SD_SERVER"
        )
    checkpoint = os.environ.get("BLAZAR_TEST_SD_MODEL")
    if not checkpoint or not Path(checkpoint).is_file():
        pytest.skip(
            "no diffusion checkpoint: set BLAZAR_TEST_SD_MODEL to a file that `sd-server -m FILE` loads"
        )
    return server, Path(checkpoint)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    server, checkpoint = _requirements()
    home = tmp_path_factory.mktemp("images") / "home"
    home.mkdir()
    (home / "config.toml").write_text(f'[engine]\nsd_server = "{server}"\nstart_timeout_s = 900\n')
    add_image_model(Store(home / "models"), checkpoint, MODEL)
    d = start_daemon(home)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=1800)


def _png(b64: str | None) -> tuple[int, int]:
    assert b64, "no b64_json in the answer"
    info = image_info(base64.b64decode(b64))
    assert info.format == "png"
    return info.width, info.height


def test_generation_as_base64_and_as_a_url(daemon: DaemonProc, client: openai.OpenAI) -> None:
    made = client.images.generate(model=MODEL, prompt="a red circle on white", n=2, size=f"{SIDE}x{SIDE}")
    assert len(made.data) == 2 and made.created > 0
    assert all(_png(d.b64_json) == (SIDE, SIDE) for d in made.data)
    assert made.size == f"{SIDE}x{SIDE}"

    linked = client.images.generate(
        model=MODEL, prompt="a blue square", size=f"{SIDE}x{SIDE}", response_format="url"
    )
    url = linked.data[0].url
    assert url and url.startswith(daemon.url + "/v1/images/files/img_")
    fetched = httpx.get(url, timeout=30)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert image_info(fetched.content).width == SIDE
    assert [e["lane"] for e in daemon.engines() if e.get("model") == MODEL] == ["sdcpp"]


def test_edit_with_a_mask(client: openai.OpenAI) -> None:
    source = client.images.generate(model=MODEL, prompt="a grey stone wall", size=f"{SIDE}x{SIDE}")
    image = base64.b64decode(source.data[0].b64_json or "")
    mask = png(SIDE, SIDE, gray=True)  # black: keep everything but what the model redraws anyway
    edited = client.images.edit(
        model=MODEL, prompt="a stone wall with ivy", image=("wall.png", image), mask=("mask.png", mask)
    )
    assert _png(edited.data[0].b64_json) == (SIDE, SIDE)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's create_variation
def test_variation_and_upscale_run_as_native_jobs(daemon: DaemonProc, client: openai.OpenAI) -> None:
    source = client.images.generate(model=MODEL, prompt="a yellow flower", size=f"{SIDE}x{SIDE}")
    image = base64.b64decode(source.data[0].b64_json or "")
    varied = client.images.create_variation(model=MODEL, image=("flower.png", image), n=1)
    assert _png(varied.data[0].b64_json) == (SIDE, SIDE)

    up = httpx.post(
        f"{daemon.url}/v1/images/upscale",
        data={"model": MODEL, "upscaler": "Lanczos", "scale": "2"},
        files={"image": ("flower.png", image, "image/png")},
        timeout=1800,
    )
    assert up.status_code == 200, up.text
    assert _png(up.json()["data"][0]["b64_json"]) == (2 * SIDE, 2 * SIDE)
