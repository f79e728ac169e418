"""The image routes through the real gateway: every check that needs no engine.

sd-server cannot run on these machines (no build, no diffusion weights), so what is
tested here is what happens before an engine would start: a bad request is a 400 in
OpenAI's shape with its ``blazar_code``, a text model is refused with
``MODEL_KIND_MISMATCH``, an image model reaches the stable-diffusion.cpp lane (refused
with its install hint where that lane is not installed), strict mode refuses what would
be ignored, and no engine was started by any of it. The official ``openai`` client
sends the requests where it can, so the wire shapes are the SDK's own. The whole path
with sd-server runs in ``tests/e2e/test_images_sdcpp.py`` where one is installed."""

from __future__ import annotations

import base64
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import msgspec
import openai
import pytest
import trio

from blazar.auth.keys import KeyStore, keys_path
from blazar.dialects.images import Images
from blazar.serve.stores.image_files import ImageFiles, files_of
from blazar.web.asgi.call import Call
from blazar.web.routes.openai import images as web_images
from registry.store import ModelFile, ModelRecord, Store
from tests.blazar.test_images_dialect import png
from tests.instant import MODEL, Gateway, instant_config, serve_gateway

DIFFUSION = "tiny-diffusion"


def add_image_model(store: Store, checkpoint: Path, name: str = DIFFUSION) -> None:
    """A model of kind ``image`` as the store records a diffusion checkpoint: one file,
    which its engine opens where it is."""
    digest = store.add_file(checkpoint, link=True)
    size = checkpoint.stat().st_size
    now = time.time()
    store.write_manifest(
        ModelRecord(
            name=name,
            digest=digest,
            size=size,
            path=str(checkpoint),
            format="diffusion",
            kind="image",
            source="test",
            created_at=now,
            modified_at=now,
            files=[ModelFile(name=checkpoint.name, digest=digest, size=size)],
            entry=checkpoint.name,
        )
    )


@pytest.fixture(scope="module")
def image_models(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    root = tmp_path_factory.mktemp("images")
    store = Store(root / "models")
    store.import_file(model_path, MODEL, source="test")
    checkpoint = root / "model.safetensors"  # no real checkpoint: nothing here loads it
    checkpoint.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    add_image_model(store, checkpoint)
    return root / "models"


@pytest.fixture
def image_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_models: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(image_models)
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sd-server on it, whatever this machine has
    return home


@asynccontextmanager
async def gateway() -> AsyncIterator[tuple[Gateway, openai.AsyncOpenAI]]:
    async with serve_gateway(instant_config()) as gw:
        sdk = openai.AsyncOpenAI(
            base_url=f"{str(gw.client.base_url).rstrip('/')}/v1", api_key="none", max_retries=0
        )
        with trio.fail_after(60):
            yield gw, sdk


def _error(exc: openai.APIStatusError) -> dict[str, object]:
    body = exc.body
    assert isinstance(body, dict), body
    return body


def assert_no_engine_started(gw: Gateway) -> None:
    assert gw.runtime.loaded() == [], "a refused image request started an engine"


async def test_bad_generations_are_refused_before_any_engine(image_home: Path) -> None:
    async with gateway() as (gw, sdk):
        cases: list[tuple[dict[str, object], str, str | None]] = [
            ({"model": DIFFUSION, "prompt": ""}, "BAD_REQUEST", "prompt"),
            ({"model": DIFFUSION, "prompt": "a cat", "n": 9}, "BAD_REQUEST", "n"),
            ({"model": DIFFUSION, "prompt": "a cat", "size": "huge"}, "BAD_REQUEST", "size"),
            ({"model": DIFFUSION, "prompt": "a cat", "size": "8x8"}, "BAD_REQUEST", "size"),
            (
                {"model": DIFFUSION, "prompt": "a cat", "response_format": "png"},
                "BAD_REQUEST",
                "response_format",
            ),
            ({"model": DIFFUSION, "prompt": "a cat", "stream": True}, "BAD_REQUEST", "stream"),
        ]
        for body, code, param in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await sdk.images.generate(**body)  # type: ignore[arg-type]
            error = _error(caught.value)
            assert (error["blazar_code"], error["param"]) == (code, param), error
            assert error["type"] == "invalid_request_error" and error["message"]
        r = await gw.client.post("/v1/images/generations", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "INVALID_JSON"
        assert_no_engine_started(gw)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's create_variation
async def test_bad_uploads_are_refused_before_any_engine(image_home: Path) -> None:
    photo = png(64, 64)
    async with gateway() as (gw, sdk):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.edit(model=DIFFUSION, prompt="snow", image=("a.png", b"GIF89a not an image"))
        assert _error(caught.value)["blazar_code"] == "IMAGE_INVALID"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.edit(
                model=DIFFUSION, prompt="snow", image=("a.png", photo), mask=("m.png", png(32, 64, gray=True))
            )
        error = _error(caught.value)
        assert (error["blazar_code"], error["param"]) == ("IMAGE_INVALID", "mask")
        assert "32x64" in str(error["message"]) and "64x64" in str(error["message"])
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.create_variation(model=DIFFUSION, image=("a.png", b""))
        assert _error(caught.value)["blazar_code"] == "IMAGE_INVALID"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.create_variation(model=DIFFUSION, image=("a.png", photo), n=0)
        assert _error(caught.value)["param"] == "n"
        up = await gw.client.post(
            "/v1/images/upscale", data={"model": DIFFUSION, "scale": "9"}, files={"image": ("a.png", photo)}
        )
        assert up.status_code == 400 and up.json()["error"]["param"] == "scale"
        not_form = await gw.client.post("/v1/images/edits", json={"model": DIFFUSION, "prompt": "x"})
        assert not_form.status_code == 400 and "multipart" in not_form.json()["error"]["message"]
        assert_no_engine_started(gw)


async def test_a_text_model_is_refused_by_kind_and_an_image_model_reaches_its_lane(image_home: Path) -> None:
    async with gateway() as (gw, sdk):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.generate(model=MODEL, prompt="a cat")
        error = _error(caught.value)
        assert error["blazar_code"] == "MODEL_KIND_MISMATCH"
        assert "chat" in str(error["message"]) and "POST /v1/chat/completions" in str(error["message"])

        with pytest.raises(openai.BadRequestError) as caught:  # no sd-server here: the lane says how
            await sdk.images.generate(model=DIFFUSION, prompt="a cat")
        error = _error(caught.value)
        assert error["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE"
        said = str(error["message"])
        assert "it runs on sdcpp, not installed here — sdcpp: build stable-diffusion.cpp's sd-server" in said

        with pytest.raises(openai.BadRequestError) as caught:  # and the way back: a text route
            await sdk.chat.completions.create(model=DIFFUSION, messages=[{"role": "user", "content": "hi"}])
        error = _error(caught.value)
        assert error["blazar_code"] == "MODEL_KIND_MISMATCH"
        assert "POST /v1/images/generations" in str(error["message"])

        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.images.generate(model="no-such-model", prompt="a cat")
        assert _error(caught.value)["blazar_code"] == "MODEL_NOT_FOUND"
        assert_no_engine_started(gw)


async def test_strict_mode_refuses_what_would_be_ignored(image_home: Path) -> None:
    async with gateway() as (gw, sdk):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.images.generate(
                model=DIFFUSION, prompt="a cat", quality="hd", extra_headers={"X-Blazar-Strict": "1"}
            )
        error = _error(caught.value)
        assert (error["blazar_code"], error["param"]) == ("PARAMETER_IGNORED", "quality")
        r = await gw.client.post(
            "/v1/images/variations",
            data={"model": DIFFUSION, "user": "u1"},
            files={"image": ("a.png", png(64, 64))},
            headers={"X-Blazar-Strict": "1"},
        )
        assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "PARAMETER_IGNORED"
        assert_no_engine_started(gw)


async def test_image_files_and_unserved_image_routes(image_home: Path) -> None:
    async with gateway() as (gw, _):
        r = await gw.client.get("/v1/images/files/img_0123.png")
        assert r.status_code == 404 and r.json()["error"]["blazar_code"] == "IMAGE_FILE_NOT_FOUND"
        r = await gw.client.post("/v1/images/inpaint", json={})
        assert r.status_code == 501 and "/v1/images/generations" in r.json()["error"]["message"]


def test_the_file_store_expires_and_keeps_to_its_budget() -> None:
    now = [0.0]
    files = ImageFiles(max_bytes=10, ttl_s=60, clock=lambda: now[0])
    a = files.put(b"aaaa", "image/png")
    assert a.startswith("img_") and a.endswith(".png") and files.get(a) == (b"aaaa", "image/png")
    now[0] = 30
    b = files.put(b"bbbbbb", "image/jpeg")
    c = files.put(b"cc", "image/webp")  # 12 bytes would not fit: the oldest leaves
    assert files.get(a) is None and files.get(b) == (b"bbbbbb", "image/jpeg") and c.endswith(".webp")
    assert files.statistics().evicted == 1 and files.statistics().bytes == 8
    now[0] = 91  # b's hour (60 s here) is up; c's too
    assert files.get(b) is None and files.get(c) is None and files.statistics().bytes == 0


def test_the_answer_names_a_rounded_size_and_serves_urls_from_the_store() -> None:
    """``_answer`` on what sd-server would send: two 64x64 PNGs for a request of 72x72."""
    owner = ImageFiles()  # the store is per runtime; any object that takes a weak reference keys it
    call = Call(
        {
            "method": "POST",
            "path": "/v1/images/generations",
            "scheme": "https",
            "headers": [(b"host", b"h:1")],
        },
        trace_id="t",
        max_body=1 << 20,
    )
    made = Images([base64.b64encode(png(64, 64)).decode()] * 2, "png")
    runtime = cast(Any, owner)
    reply = web_images._answer(
        runtime, call, made, response_format="url", ignored=["quality"], asked=(72, 72)
    )
    assert reply.headers == {
        "X-Blazar-Ignored": "quality",
        "X-Blazar-Changed": "size=64x64",
        "X-Blazar-Warnings": "params_ignored,params_changed",
    }
    doc = msgspec.json.decode(cast(bytes, reply.body))
    urls = [d["url"] for d in doc["data"]]
    assert len(urls) == 2 and all(u.startswith("https://h:1/v1/images/files/img_") for u in urls)
    assert doc["size"] == "64x64" and doc["output_format"] == "png"
    stored = files_of(owner).get(urls[0].rsplit("/", 1)[1])
    assert stored == (png(64, 64), "image/png")

    inline = web_images._answer(runtime, call, made, response_format=None, ignored=[], asked=(64, 64))
    assert inline.headers == {} and msgspec.json.decode(cast(bytes, inline.body))["data"][0]["b64_json"]


async def test_the_image_routes_and_files_need_the_images_scope(image_home: Path) -> None:
    keys = KeyStore(keys_path(image_home))
    _, chat_only = keys.add("chatter", families=("chat",))
    _, painter = keys.add("painter", families=("images",))
    async with gateway() as (gw, _):
        body = {"model": DIFFUSION, "prompt": "a cat", "n": 99}
        r = await gw.client.post("/v1/images/generations", json=body, headers={"x-api-key": chat_only})
        assert r.status_code == 403 and r.json()["error"]["blazar_code"] == "KEY_SCOPE_FORBIDDEN"
        r = await gw.client.get("/v1/images/files/img_0.png", headers={"x-api-key": chat_only})
        assert r.status_code == 403
        r = await gw.client.post("/v1/images/generations", json=body, headers={"x-api-key": painter})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"  # in scope: checked as usual


# -- videos ----------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the SDK warns on each call
async def test_bad_video_requests_are_refused_before_any_engine(image_home: Path) -> None:
    async with gateway() as (gw, sdk):
        for fields, param in (({"prompt": ""}, "prompt"), ({"prompt": "waves", "seconds": "99"}, "seconds")):
            r = await gw.client.post(
                "/v1/videos", data={"model": DIFFUSION, **fields}, files={"x": ("x", b"")}
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.videos.create(model=MODEL, prompt="waves")  # type: ignore[arg-type]
        assert _error(caught.value)["blazar_code"] == "MODEL_KIND_MISMATCH"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.videos.create(
                model=DIFFUSION, prompt="waves", input_reference=("a.png", b"not an image")
            )  # type: ignore[arg-type]
        assert _error(caught.value)["blazar_code"] == "IMAGE_INVALID"
        r = await gw.client.post(
            "/v1/videos/generations",
            data={"model": DIFFUSION, "prompt": "waves"},
            files={"input_reference": ("a.png", png(64, 64))},
        )
        assert r.status_code == 400 and r.json()["error"]["blazar_code"] == "MODEL_UNSUPPORTED_ENGINE", r.text
        assert (await sdk.videos.list()).data == []
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.videos.retrieve("video_nope")
        assert _error(caught.value)["blazar_code"] == "JOB_NOT_FOUND"
        assert_no_engine_started(gw)


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the SDK warns on each call
async def test_a_video_job_that_fails_reads_as_a_failed_video(image_home: Path) -> None:
    """A video job queued by an earlier daemon whose lane is gone now: the job runs, fails
    with the lane's reason, and the Videos API shows it so (no content to download)."""
    async with gateway() as (gw, sdk):
        payload = {
            "model": DIFFUSION,
            "prompt": "waves",
            "seconds": "4",
            "size": "",
            "body": {"prompt": "waves"},
        }
        job = await gw.runtime.jobs.submit("video", msgspec.json.encode(payload), model=DIFFUSION)
        with trio.fail_after(30):
            async for _ in gw.runtime.jobs.follow(job.id):  # until the job has ended
                pass
        video = await sdk.videos.retrieve(job.id)
        assert video.status == "failed" and video.error is not None
        assert "it runs on sdcpp, not installed here" in video.error.message and video.seconds == "4"
        assert video.prompt == "waves" and video.completed_at is not None and video.progress == 0
        listed = await sdk.videos.list()
        assert [v.id for v in listed.data] == [job.id] and listed.has_more is False
        r = await gw.client.get(f"/v1/videos/{job.id}/content")
        assert r.status_code == 404 and "it is failed" in r.json()["error"]["message"]
        r = await gw.client.get(f"/v1/jobs/{job.id}")  # a job like any other
        assert r.status_code == 200 and r.json()["kind"] == "video"
        events = await gw.client.get(f"/v1/jobs/{job.id}/events", headers={"accept": "text/event-stream"})
        # An ended job's stream: never cached, never held back by a buffering proxy.
        assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
        assert events.headers["x-accel-buffering"] == "no" and events.headers["cache-control"] == "no-cache"


async def test_an_sd_server_that_fails_to_start_is_a_502_in_openais_shape(image_home: Path) -> None:
    """The configured program exits at once (``false`` stands where a broken build would):
    the image route claims the engine, the start fails, the client gets ENGINE_CRASHED."""
    program = shutil.which("false", path="/usr/bin:/bin")
    assert program is not None
    config = instant_config()
    config = msgspec.structs.replace(
        config, engine=msgspec.structs.replace(config.engine, sd_server=program, start_timeout_s=20.0)
    )
    async with serve_gateway(config) as gw:
        with trio.fail_after(60):
            r = await gw.client.post("/v1/images/generations", json={"model": DIFFUSION, "prompt": "a cat"})
        assert r.status_code == 502, r.text
        assert r.json()["error"]["blazar_code"] == "ENGINE_CRASHED"
