"""Ollama's create path refuses a GGUF cut short, as ``blazar import`` does: uploaded as a
blob and named in ``POST /api/create``, a file whose header lists more tensor data than it
holds is answered ``MODEL_FILE_INCOMPLETE`` with the bytes it lacks, and no model is made."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from registry.gguf import read_header
from tests.instant import instant_config, serve_gateway


@pytest.fixture
def cut(model_path: Path) -> bytes:
    """The test model's header and the first MiB of its tensor data."""
    return model_path.read_bytes()[: read_header(model_path).data_offset + (1 << 20)]


async def test_a_truncated_gguf_does_not_become_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: bytes
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("BLAZAR_HOME", str(home))
    monkeypatch.setenv("BENCH_PYTHON", sys.executable)
    digest = "sha256:" + hashlib.sha256(cut).hexdigest()
    async with serve_gateway(instant_config()) as gw:
        uploaded = await gw.client.post(f"/api/blobs/{digest}", content=cut)
        assert uploaded.status_code == 201, uploaded.text
        created = await gw.client.post(
            "/api/create", json={"model": "cut-short", "files": {"m.gguf": digest}, "stream": False}
        )
        tags = (await gw.client.get("/api/tags")).json()
    assert created.status_code == 422, created.text
    error = created.json()
    assert error["blazar_code"] == "MODEL_FILE_INCOMPLETE"
    assert f"found {len(cut)}" in error["error"] and digest in error["error"]
    assert str(home) not in created.text  # the blob is named by its digest, never by its path
    assert "cut-short" not in {m["name"].split(":")[0] for m in tags["models"]}
