"""``blazar drafts MODEL``: which installed models can draft for it, smallest first, and why
the others cannot. The draft here is a small GGUF written with the test model's own
vocabulary (its tokenizer model, pre-tokenizer, tokens and BOS/EOS), as a real draft of the
same family would have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from registry.gguf import read_header
from registry.store import Store
from tests.support import MODEL, ensure_model, make_home

ROOT = Path(__file__).parents[2]


def _gguf(path: Path, *, tokens: list[str], model: str, pre: str, bos: int, eos: int) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_drafts_lists_the_models_that_pair_first(tmp_path: Path) -> None:
    model_path = ensure_model()
    home = make_home(tmp_path / "home", model_path)
    header = read_header(model_path)
    vocab = [f"t{i}" for i in range(header.array_lengths["tokenizer.ggml.tokens"])]
    store = Store(home / "models")
    same = _gguf(tmp_path / "d.gguf", tokens=vocab, model="gpt2", pre="smollm", bos=1, eos=2)
    store.import_file(same, "tiny-draft", source="test")
    other = _gguf(tmp_path / "o.gguf", tokens=vocab[:1000], model="llama", pre="default", bos=1, eos=2)
    store.import_file(other, "other-family", source="test")
    store.import_file(model_path, "self-copy", source="test")
    env = {**os.environ, "BLAZAR_HOME": str(home)}

    def drafts(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "blazar", "drafts", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
        )

    done = drafts(MODEL, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {d["name"]: d for d in doc["drafts"]}
    assert doc["drafts"][0]["name"] == "tiny-draft" and rows["tiny-draft"]["pairs"] is True
    assert rows["other-family"]["pairs"] is False and "vocabulary" in rows["other-family"]["why"]
    assert rows["self-copy"]["pairs"] is False and "itself" in rows["self-copy"]["why"]
    assert MODEL not in rows
    text = drafts(MODEL)
    assert text.returncode == 0 and 'spec = {draft = "tiny-draft"}' in text.stdout
    missing = drafts("no-such-model")
    assert missing.returncode != 0 and "no-such-model" in missing.stderr
