"""The image dialect (``blazar.dialects.images``): OpenAI's image requests checked, the bodies
sd-server takes made from them (golden files), and its answers read back into OpenAI's shape.

The shapes on sd-server's side are those of stable-diffusion.cpp's ``examples/server``
(routes_openai.cpp, routes_sdcpp.cpp, async_jobs.cpp): ``{"error": "…"}`` errors, base64
images only, native jobs ``{id, kind, status, result: {images: [{index, b64_json}]}}``."""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from actors.engines.multipart import parse_form
from blazar.dialects import images, videos
from blazar.dialects.neutral import DecodeError
from tests.golden import assert_golden

GOLDEN = Path(__file__).parent / "golden" / "images"


def png(width: int, height: int, *, gray: bool = False) -> bytes:
    """A real PNG: every pixel black (RGB, or one gray channel for a mask)."""
    channels, color = (1, 0) if gray else (3, 2)
    rows = b"".join(b"\x00" + b"\x00" * (width * channels) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG's opening segments (SOI, APP0, SOF0): what ``image_info`` reads."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = (
        b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    )
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def webp_vp8x(width: int, height: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_lossless(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + bits.to_bytes(4, "little") + b"\x00" * 5
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


@dataclass(frozen=True)
class FakePart:
    """A form part as the route's parser hands it over (name → parts)."""

    data: bytes
    filename: str | None = None


def form(**fields: bytes | str | list[bytes]) -> dict[str, list[FakePart]]:
    out: dict[str, list[FakePart]] = {}
    for name, value in fields.items():
        key = name.replace("_brackets", "[]")
        if isinstance(value, list):
            out[key] = [FakePart(v, f"f{i}.png") for i, v in enumerate(value)]
        elif isinstance(value, bytes):
            out[key] = [FakePart(value, "f.png")]
        else:
            out[key] = [FakePart(value.encode())]
    return out


def refusal(fn: object, arg: object) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        fn(arg)  # type: ignore[operator]
    return caught.value


# -- sizes and images ------------------------------------------------------------------------


def test_sizes() -> None:
    assert images.parse_size("512x768") == (512, 768)
    assert images.parse_size(None) is None and images.parse_size("auto") is None
    for bad in ("512", "512x", "x512", "512*512", "-64x64", "1024X1024"):
        with pytest.raises(DecodeError, match="WIDTHxHEIGHT") as caught:
            images.parse_size(bad)
        assert caught.value.param == "size"
    for out_of_range in ("32x512", "512x8192", "0x0"):
        with pytest.raises(DecodeError, match="from 64 to 4096"):
            images.parse_size(out_of_range)


def test_image_info_reads_each_format_from_its_header() -> None:
    assert images.image_info(png(40, 30)) == images.ImageInfo("png", 40, 30)
    assert images.image_info(jpeg_header(640, 480)) == images.ImageInfo("jpeg", 640, 480)
    assert images.image_info(webp_vp8x(800, 600)) == images.ImageInfo("webp", 800, 600)
    assert images.image_info(webp_lossless(17, 9)) == images.ImageInfo("webp", 17, 9)
    for bad, why in [
        (b"", "empty"),
        (b"GIF89a" + b"\x00" * 20, "unknown file type"),
        (b"\x89PNG\r\n\x1a\n", "IHDR"),
    ]:
        err = refusal(images.image_info, bad)
        assert err.code == "IMAGE_INVALID" and why in err.message and err.param == "image"


# -- generations -----------------------------------------------------------------------------


def test_a_generation_relays_only_what_sd_server_reads() -> None:
    body = msgspec.json.encode(
        {
            "model": "sdxl-turbo",
            "prompt": "a lighthouse at dusk",
            "n": 2,
            "size": "768x512",
            "output_format": "webp",
            "output_compression": 80,
            "response_format": "url",
            "quality": "hd",
            "style": "vivid",
            "user": "u-1",
            "background": "opaque",  # what it draws anyway: not reported
            "stream": False,
            "seed": 7,  # unknown to OpenAI's API: named, not sent
        }
    )
    req = images.decode_generation(body)
    assert (req.model, req.n, req.size, req.response_format) == ("sdxl-turbo", 2, (768, 512), "url")
    assert sorted(req.ignored) == ["quality", "seed", "style", "user"]
    assert_golden(GOLDEN / "generation.sdcpp.json", images.generation_body(req), as_json=True)

    plain = images.decode_generation(b'{"model": "m", "prompt": "p"}')
    assert plain.ignored == [] and plain.n == 1
    assert msgspec.json.decode(images.generation_body(plain)) == {"prompt": "p", "n": 1}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "m"}, "prompt", "missing required field `prompt`"),
        ({"model": "m", "prompt": "  "}, "prompt", "missing required field `prompt`"),
        ({"prompt": "p"}, "model", "missing required field `model`"),
        ({"model": "m", "prompt": "p", "n": 0}, "n", "from 1 to 8"),
        ({"model": "m", "prompt": "p", "n": 9}, "n", "from 1 to 8"),
        ({"model": "m", "prompt": "p", "size": "big"}, "size", "WIDTHxHEIGHT"),
        ({"model": "m", "prompt": "p", "response_format": "png"}, "response_format", "b64_json, url"),
        ({"model": "m", "prompt": "p", "output_format": "gif"}, "output_format", "png, jpeg, webp"),
        ({"model": "m", "prompt": "p", "output_compression": 101}, "output_compression", "0 to 100"),
        ({"model": "m", "prompt": "p", "stream": True}, "stream", "partial images are not streamed"),
    ],
)
def test_a_bad_generation_names_its_field(body: dict[str, object], param: str, words: str) -> None:
    err = refusal(images.decode_generation, msgspec.json.encode(body))
    assert err.code == "BAD_REQUEST" and err.param == param and words in err.message


def test_a_generation_that_is_no_json_object() -> None:
    assert refusal(images.decode_generation, b"{nope").code == "INVALID_JSON"
    err = refusal(images.decode_generation, b'{"model": "m", "prompt": "p", "n": "2"}')
    assert "Expected `int | null`, got `str`" in err.message and err.param == "n"


# -- edits -----------------------------------------------------------------------------------


def test_an_edit_becomes_sd_servers_form() -> None:
    photo, mask = png(64, 64), png(64, 64, gray=True)
    edit = images.decode_edit(
        form(
            model="flux-kontext",
            prompt="make it snow",
            image_brackets=[photo, png(64, 32)],
            mask=mask,
            n="2",
            size="512x512",
            output_format="jpeg",
            output_compression="90",
            input_fidelity="high",
            response_format="b64_json",
        )
    )
    assert edit.images == [photo, png(64, 32)] and edit.mask == mask and edit.n == 2
    assert edit.ignored == ["input_fidelity"]
    body = images.edit_form(edit, "XYZ")
    assert_golden(GOLDEN / "edit.sdcpp.form", body)
    parts = parse_form(body, "multipart/form-data; boundary=XYZ")  # sd-server's fields, as it reads them
    assert [p.data for p in parts["image[]"]] == [photo, png(64, 32)]
    assert parts["mask"][0].data == mask and parts["prompt"][0].text == "make it snow"
    assert {
        k: v[0].text for k, v in parts.items() if k in ("n", "size", "output_format", "output_compression")
    } == {
        "n": "2",
        "size": "512x512",
        "output_format": "jpeg",
        "output_compression": "90",
    }


def test_an_edit_takes_image_or_image_brackets() -> None:
    one = images.decode_edit(form(model="m", prompt="p", image=png(64, 64)))
    assert len(one.images) == 1 and one.mask is None and one.size is None
    parts = parse_form(images.edit_form(one, "b"), "multipart/form-data; boundary=b")
    assert set(parts) == {"prompt", "image[]", "n"}


@pytest.mark.parametrize(
    ("fields", "code", "param", "words"),
    [
        ({"prompt": "p"}, "BAD_REQUEST", "image", "missing required file `image`"),
        ({"prompt": "p", "image": b"plain text"}, "IMAGE_INVALID", "image", "PNG, JPEG or WebP"),
        ({"image": png(64, 64)}, "BAD_REQUEST", "prompt", "`prompt`"),
        ({"prompt": "p", "image": png(64, 64), "mask": png(64, 32)}, "IMAGE_INVALID", "mask", "64x32"),
        (
            {"prompt": "p", "image": png(64, 64), "mask": jpeg_header(64, 64)},
            "IMAGE_INVALID",
            "mask",
            "a PNG",
        ),
        ({"prompt": "p", "image": png(64, 64), "n": "two"}, "BAD_REQUEST", "n", "an integer"),
        (
            {"prompt": "p", "image": png(64, 64), "output_format": "webp"},
            "BAD_REQUEST",
            "output_format",
            "png, jpeg",
        ),
        ({"prompt": "p", "image": png(64, 64), "stream": "true"}, "BAD_REQUEST", "stream", "not streamed"),
    ],
)
def test_a_bad_edit_is_refused(fields: dict[str, bytes | str], code: str, param: str, words: str) -> None:
    err = refusal(images.decode_edit, form(model="m", **fields))
    assert (err.code, err.param) == (code, param) and words in err.message


# -- variations and upscales -----------------------------------------------------------------


def test_a_variation_is_a_native_job() -> None:
    photo = png(64, 48)
    v = images.decode_variation(form(model="sd15", image=photo, n="3", size="512x384", user="me"))
    assert v.ignored == ["user"] and v.size == (512, 384)
    job = images.variation_job(v)
    assert_golden(GOLDEN / "variation.sdcpp.json", job, as_json=True)
    doc = msgspec.json.decode(job)
    assert base64.b64decode(doc["init_image"]) == photo and doc["prompt"] == ""


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({}, "image", "missing required file"),
        ({"image": [png(64, 64), png(64, 64)]}, "image", "2 images were sent"),
        ({"image": png(64, 64), "mask": png(64, 64)}, "mask", "/v1/images/edits"),
        ({"image": png(64, 64), "n": "11"}, "n", "from 1 to 8"),
    ],
)
def test_a_bad_variation_is_refused(fields: dict[str, object], param: str, words: str) -> None:
    err = refusal(images.decode_variation, form(model="m", **fields))  # type: ignore[arg-type]
    assert err.param == param and words in err.message


def test_an_upscale_is_a_hires_job() -> None:
    photo = png(64, 64)
    u = images.decode_upscale(
        form(
            model="sd15",
            image=photo,
            upscaler="RealESRGAN_x4plus",
            scale="4",
            tile_size="256",
            output_format="webp",
        )
    )
    assert (u.scale, u.tile_size, u.denoising_strength) == (4.0, 256, images.DEFAULT_DENOISING)
    assert_golden(GOLDEN / "upscale.sdcpp.json", images.upscale_job(u), as_json=True)
    plain = images.decode_upscale(form(model="m", image=photo))
    hires = msgspec.json.decode(images.upscale_job(plain))["hires"]
    assert hires == {"enabled": True, "upscaler": "Lanczos", "scale": 2.0, "denoising_strength": 0.2}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"scale": "1"}, "scale", "above 1"),
        ({"scale": "8"}, "scale", "at most 4"),
        ({"scale": "x"}, "scale", "a number"),
        ({"tile_size": "0"}, "tile_size", "positive"),
        ({"denoising_strength": "0"}, "denoising_strength", "above 0"),
        ({"repeats": "2"}, "repeats", "upscales once"),
    ],
)
def test_a_bad_upscale_is_refused(fields: dict[str, str], param: str, words: str) -> None:
    err = refusal(images.decode_upscale, form(model="m", image=png(64, 64), **fields))
    assert err.param == param and words in err.message


# -- sd-server's answers ---------------------------------------------------------------------


def test_sd_servers_images_become_openais_shape() -> None:
    a, b = base64.b64encode(png(64, 64)).decode(), base64.b64encode(png(64, 64)).decode()
    reply = msgspec.json.encode(
        {"created": 1, "output_format": "png", "data": [{"b64_json": a}, {"b64_json": b}]}
    )
    result = images.decode_images(reply)
    assert result == images.Images([a, b], "png")
    info = images.image_info(images.decode_b64(a))
    out = images.encode_images(1700000000, result, size=info)
    assert_golden(GOLDEN / "generation.openai.json", out, as_json=True)
    urls = [
        "http://127.0.0.1:11435/v1/images/files/img_1.png",
        "http://127.0.0.1:11435/v1/images/files/img_2.png",
    ]
    linked = msgspec.json.decode(images.encode_images(1700000000, result, urls=urls))
    assert linked == {
        "created": 1700000000,
        "data": [{"url": urls[0]}, {"url": urls[1]}],
        "output_format": "png",
    }
    for bad in (b"{}", b'{"data": []}', b"not json"):
        with pytest.raises(ValueError, match=r"stable-diffusion\.cpp answered"):
            images.decode_images(bad)


def test_jobs_are_read_as_sd_server_reports_them() -> None:
    queued = images.decode_job(
        b'{"id":"job_1","kind":"img_gen","status":"queued","created":1,"poll_url":"/sdcpp/v1/jobs/job_1"}'
    )
    assert (queued.id, queued.done) == ("job_1", False)
    done = images.decode_job(
        b'{"id":"job_1","kind":"img_gen","status":"completed","created":1,"started":2,"completed":3,'
        b'"queue_position":0,"result":{"output_format":"png","images":[{"index":0,"b64_json":"QUJD"}]},"error":null}'
    )
    assert done.done and done.images() == images.Images(["QUJD"], "png")
    failed = images.decode_job(
        b'{"id":"job_1","kind":"img_gen","status":"failed","result":null,'
        b'"error":{"code":"generation_failed","message":"generate_image returned empty results"}}'
    )
    assert failed.done and failed.failure() == "generate_image returned empty results (generation_failed)"
    with pytest.raises(ValueError, match="without an image"):
        failed.images()


def test_sd_server_errors_are_read_in_both_its_shapes() -> None:
    assert images.engine_error_message(b'{"error":"prompt required"}') == "prompt required"
    assert images.engine_error_message(b'{"error":"server_error","message":"boom"}') == "server_error: boom"
    assert images.engine_error_message(b"<html>") == "<html>"
    assert images.engine_error_message(b"") == "no detail"


# -- videos ----------------------------------------------------------------------------------


def test_frames_are_counted_as_sd_server_counts_them() -> None:
    assert videos.frames_for(4, 16) == 65  # 4 s at 16 fps, and the first frame
    assert videos.frames_for(2, 15) == 29  # 31 frames would not be 4n + 1: the largest below
    assert all((videos.frames_for(s, f) - 1) % 4 == 0 for s in range(1, 21) for f in (8, 15, 16, 24))


def test_a_video_request_becomes_a_vid_gen_job() -> None:
    first = png(64, 64)
    req = videos.decode_video(
        form(
            model="wan",
            prompt="waves at night",
            seconds="4",
            size="832x480",
            input_reference=first,
            quality="x",
        )
    )
    assert (req.seconds, req.fps, req.size, req.output_format) == (4, 16, (832, 480), "webm")
    assert req.ignored == ["quality"]
    assert_golden(GOLDEN / "video.sdcpp.json", videos.vid_gen_body(req), as_json=True)
    frames = videos.decode_video(form(model="m", prompt="p", video_frames="33", fps="8", output_format="avi"))
    doc = msgspec.json.decode(videos.vid_gen_body(frames))
    assert doc == {"prompt": "p", "fps": 8, "output_format": "avi", "video_frames": 33}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({}, "prompt", "`prompt`"),
        ({"prompt": "p", "seconds": "0"}, "seconds", "from 1 to 20"),
        ({"prompt": "p", "seconds": "four"}, "seconds", "an integer"),
        ({"prompt": "p", "seconds": "4", "video_frames": "33"}, "video_frames", "not both"),
        ({"prompt": "p", "fps": "120"}, "fps", "from 1 to 60"),
        ({"prompt": "p", "size": "720"}, "size", "WIDTHxHEIGHT"),
        ({"prompt": "p", "output_format": "mp4"}, "output_format", "webm, webp, avi"),
        ({"prompt": "p", "input_reference": b"%PDF"}, "input_reference", "PNG, JPEG or WebP"),
        ({"prompt": "p", "remix_video_id": "video_1"}, "remix_video_id", "not served"),
    ],
)
def test_a_bad_video_request_is_refused(fields: dict[str, bytes | str], param: str, words: str) -> None:
    err = refusal(videos.decode_video, form(model="m", **fields))
    assert err.param == param and words in err.message


def test_video_jobs_and_objects() -> None:
    clip = b"\x1a\x45\xdf\xa3 a webm"
    done = (
        b'{"id":"job_9","kind":"vid_gen","status":"completed","result":{"output_format":"webm",'
        b'"mime_type":"video/webm","fps":16,"frame_count":33,"b64_json":"' + base64.b64encode(clip) + b'"}}'
    )
    assert videos.decode_video_job(done) == (
        "job_9",
        "completed",
        videos.VideoResult(clip, "video/webm", 33, 16),
        None,
    )
    failed = b'{"id":"job_9","status":"failed","error":{"code":"generation_failed","message":"no frames"}}'
    assert videos.decode_video_job(failed) == ("job_9", "failed", None, "no frames (generation_failed)")
    with pytest.raises(ValueError, match="unexpected video job"):
        videos.decode_video_job(b'{"id":"j","status":"completed","result":{"b64_json":"*not base64*"}}')
    common = {"video_id": "v1", "model": "wan", "created_at": 10.5, "updated_at": 20.0, "seconds": "4"}
    running = videos.video_object(**common, state="running", size="832x480", prompt="p", error=None)
    assert_golden(GOLDEN / "video.openai.json", msgspec.json.encode(running), as_json=True)
    cancelled = videos.video_object(**common, state="cancelled", size="", prompt=None, error=None)
    assert (cancelled["status"], cancelled["completed_at"], cancelled["error"]) == (
        "cancelled",
        20,
        {"code": "cancelled", "message": "cancelled"},
    )
