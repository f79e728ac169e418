"""``blazar mmproj MODEL FILE``: a vision projector attached to an installed model, checked
against it first; ``/api/show`` then lists vision. The projectors here are written with the
test model's embedding width: no real one for SmolLM2-135M exists, and no vision model can
be downloaded on these machines, so no image is read through one here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from registry.gguf import model_info, read_header
from registry.store import Store
from tests.support import MODEL, home_env, make_home, start_daemon

pytestmark = pytest.mark.slow


def _gguf(path: Path, arch: str, **ints: int) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in ints.items():
        writer.add_uint32(key.replace("__", "."), value)
    writer.add_tensor("mm.0.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_projector_is_checked_attached_and_shown(tmp_path: Path, model_path: Path) -> None:
    home = make_home(tmp_path / "home", model_path)
    width = model_info(read_header(model_path)).embedding_length
    assert width
    good = _gguf(tmp_path / "mmproj.gguf", "clip", clip__vision__projection_dim=width)
    wrong = _gguf(tmp_path / "other.gguf", "clip", clip__vision__projection_dim=width * 2)
    not_one = _gguf(tmp_path / "plain.gguf", "llama")

    refused = run_cli(home, "mmproj", MODEL, str(wrong))
    assert refused.returncode == 1 and "made for another model" in refused.stderr
    refused = run_cli(home, "mmproj", MODEL, str(not_one))
    assert refused.returncode == 1 and "not a vision projector" in refused.stderr
    assert Store(home / "models").get(MODEL).projector is None

    d = start_daemon(home)
    try:
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        body = {"model": MODEL, "messages": [{"role": "user", "content": [image]}], "max_tokens": 2}
        missing = httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=60)
        assert missing.status_code == 400 and f"blazar mmproj {MODEL}" in missing.json()["error"]["message"]
        shown = httpx.post(f"{d.url}/api/show", json={"model": MODEL}, timeout=30).json()
        assert "vision" not in shown["capabilities"]
        listed = httpx.get(f"{d.url}/v1/models/{MODEL}", timeout=30).json()
        assert listed["blazar_capabilities"] == ["completion", "tools"]

        attached = run_cli(home, "mmproj", MODEL, str(good))
        assert attached.returncode == 0, attached.stderr
        record = Store(home / "models").get(MODEL)
        assert record.projector is not None and Path(record.projector).is_file()
        shown = httpx.post(f"{d.url}/api/show", json={"model": MODEL}, timeout=30).json()
        assert "vision" in shown["capabilities"]
        models = httpx.get(f"{d.url}/v1/models", timeout=30).json()["data"]
        assert next(m for m in models if m["id"] == MODEL)["blazar_capabilities"] == [
            "completion",
            "tools",
            "vision",
        ]
    finally:
        d.stop()
