"""``blazar quantize``: the test model in f16 quantized by the command itself (no
llama-quantize on the ``PATH`` it runs with: the built-in writer), the result run in the
real engine, ``--verify`` measured by it, and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from actors import RuntimeConfig, open_runtime
from registry.store import Store
from tests.support import MODEL, home_env, make_home
from tests.synthetic_f16 import build_f16_model

pytestmark = pytest.mark.slow

F16 = "smollm2-f16"
_SHORT_TEXT = (
    "The cat sat on the warm mat by the door and watched the birds in the garden. When the sun "
    "went down, it walked into the kitchen and waited for its dinner."
)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    root = tmp_path_factory.mktemp("quantize")
    home = make_home(root / "home", model_path)
    Store(home / "models").import_file(build_f16_model(model_path, root), F16, source="test")
    (root / "bin").mkdir()
    return home


def _blazar(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = home_env(home)
    env["PATH"] = str(home.parent / "bin")  # no llama-quantize, whatever this machine has
    return subprocess.run(
        [sys.executable, "-m", "blazar", *args], env=env, capture_output=True, text=True, timeout=600
    )


def _blobs(home: Path) -> set[str]:
    return {p.name for p in (home / "models" / "blobs").iterdir()}


async def _continue(home: Path, model: str, prompt: str) -> str:
    config = RuntimeConfig.in_home(str(home), default_ctx=512, keep_alive_s=-1)
    async with open_runtime(config) as rt, rt.claim(model, client="test") as claim:
        body = {"prompt": prompt, "n_predict": 6, "temperature": 0}
        resp = await claim.handle.client.post("/completion", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["content"])


async def test_q8_0_is_verified_kept_and_answers(home: Path) -> None:
    done = _blazar(home, "quantize", F16, "Q8_0", "--verify")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"quantized {F16} (270.9 MB) to Q8_0: smollm2-q8_0 (144.8 MB, sha256:")
    before = float(next(x for x in lines if "perplexity before:" in x).split()[2])
    after = float(next(x for x in lines if "perplexity after:" in x).split()[2])
    assert 5 < before < 60 and 5 < after < 60  # a model that reads English, both times
    change = next(x for x in lines if "degradation:" in x)
    assert f"{(after - before) / before * 100:+.2f}%" in change and "(limit 10%)" in change
    assert lines[-1] == "kept smollm2-q8_0"
    record = Store(home / "models").get("smollm2-q8_0")
    assert record.source == f"quantize:{F16}:Q8_0"
    # The result runs in the engine through the runtime, and still knows its weekdays.
    assert "Thursday" in await _continue(home, "smollm2-q8_0", "Monday, Tuesday, Wednesday,")


def test_a_result_that_degrades_too_much_is_removed(home: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text(_SHORT_TEXT)
    blobs = _blobs(home)
    done = _blazar(
        home, "quantize", F16, "Q4_0", "--name", "tiny", "--verify", "--text", str(text),
        "--max-degradation", "0.0001",
    )  # fmt: skip
    assert done.returncode == 1
    change = float(next(x for x in done.stdout.splitlines() if "degradation:" in x).split()[1].rstrip("%"))
    assert change > 0.0001
    assert "tiny degrades the perplexity by" in done.stderr and "it was not kept" in done.stderr
    assert Store(home / "models").find("tiny") is None
    assert _blobs(home) == blobs  # its file went with it


def test_refusals_say_what_to_do(home: Path, tmp_path: Path) -> None:
    again = _blazar(home, "quantize", MODEL, "Q8_0")
    assert again.returncode == 1
    assert "already quantized (Q4_1, Q8_0)" in again.stderr and "--allow-requantize" in again.stderr
    k_quant = _blazar(home, "quantize", F16, "Q4_K_M")
    assert k_quant.returncode == 1
    assert "llama-quantize" in k_quant.stderr and "BLAZAR_LLAMA_QUANTIZE" in k_quant.stderr
    (tmp_path / "m.imatrix").write_bytes(b"x")
    imatrix = _blazar(home, "quantize", F16, "Q8_0", "--imatrix", str(tmp_path / "m.imatrix"))
    assert imatrix.returncode == 1 and "--imatrix is read by llama.cpp's quantizer alone" in imatrix.stderr
    limit = _blazar(home, "quantize", F16, "Q8_0", "--max-degradation", "5")
    assert limit.returncode == 1 and "give --verify too" in limit.stderr
    for done in (again, k_quant, imatrix, limit):
        assert str(home) not in done.stderr and "Traceback" not in done.stderr
    names = {r.name for r in Store(home / "models").list()}
    assert names <= {MODEL, F16, "smollm2-q8_0"}
