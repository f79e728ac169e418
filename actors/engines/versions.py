"""Engines as versioned software: installed versions side by side, the active one, receipts.

Under ``<home>/engines/<lane>/<version>/`` each version has a ``manifest.json`` and either
a virtual environment (an engine that ships on PyPI: the llama.cpp host's ``xllamacpp``, the
``mistralrs`` wheel) whose wheels were installed from hashes pinned at download, or one
executable file whose SHA-256 was checked (a ``llama-server`` or ``mistralrs`` binary given
by path or URL). ``active.json`` names each lane's active version with the ones before it
(what ``rollback`` returns to); a lane with none runs what the daemon was installed with
(``bundled``). ``receipts.json`` keeps measured decode speeds tagged with the version.

Everything here is blocking file and process work: call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Literal

import msgspec

from registry.files import atomic_write

__all__ = [
    "BUNDLED",
    "DISTS",
    "EngineVersion",
    "Receipt",
    "VersionError",
    "Versions",
    "bundled_version",
    "code_root",
]

DISTS = {"llamacpp": "xllamacpp", "mistralrs": "mistralrs"}
"""The PyPI distribution each lane's host runs on."""
BUNDLED = "bundled"
"""The version name of what the daemon's own environment has."""
_HISTORY = 10


class VersionError(Exception):
    """A version that cannot be installed, found, switched to or removed; the message says why."""


class EngineVersion(msgspec.Struct, frozen=True, kw_only=True):
    lane: str
    version: str
    form: Literal["wheel", "binary"]
    path: str
    """The venv's interpreter (``wheel``) or the executable (``binary``)."""
    dist: str | None = None
    files: dict[str, str] = {}
    """Every installed file (wheel or binary) → its SHA-256."""
    source: str = ""
    installed_at: float = 0.0


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    lane: str
    version: str
    engine: str | None
    """What ran, as the engine reported itself (``xllamacpp 2026.10.11549``)."""
    model: str
    decode_tps: float
    at: float


class _Active(msgspec.Struct, kw_only=True):
    lanes: dict[str, list[str]] = {}
    """Lane → its versions, the active one last."""


def code_root() -> Path:
    """The directory our ``actors`` package is imported from (a venv's host needs it)."""
    import actors

    return Path(actors.__file__).resolve().parent.parent


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(argv: list[str], what: str, timeout_s: float = 900) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        raise VersionError(f"{what} failed: {' | '.join(tail)}")
    return done.stdout


class Versions:
    def __init__(self, home: str | Path) -> None:
        self.root = Path(home) / "engines"

    # -- reading --------------------------------------------------------

    def installed(self) -> list[EngineVersion]:
        found = []
        for manifest in sorted(self.root.glob("*/*/manifest.json")):
            try:
                found.append(msgspec.json.decode(manifest.read_bytes(), type=EngineVersion))
            except (OSError, msgspec.DecodeError):
                continue  # a half-written install: not a version
        return found

    def get(self, lane: str, version: str) -> EngineVersion | None:
        manifest = self.root / lane / version / "manifest.json"
        try:
            return msgspec.json.decode(manifest.read_bytes(), type=EngineVersion)
        except (OSError, msgspec.DecodeError):
            return None

    def _active(self) -> _Active:
        try:
            return msgspec.json.decode((self.root / "active.json").read_bytes(), type=_Active)
        except (OSError, msgspec.DecodeError):
            return _Active()

    def history(self, lane: str) -> list[str]:
        """The lane's versions as they were made active, the active one last."""
        return list(self._active().lanes.get(lane, []))

    def active_name(self, lane: str) -> str:
        history = self.history(lane)
        return history[-1] if history else BUNDLED

    def active(self, lane: str) -> EngineVersion | None:
        """The lane's active installed version; None: the bundled one."""
        name = self.active_name(lane)
        return None if name == BUNDLED else self.get(lane, name)

    # -- changing -------------------------------------------------------

    def _write_active(self, state: _Active) -> None:
        atomic_write(self.root / "active.json", msgspec.json.encode(state))

    def set_active(self, lane: str, version: str) -> None:
        if version != BUNDLED and self.get(lane, version) is None:
            raise VersionError(f"{lane}@{version} is not installed (`blazar engine list`)")
        state = self._active()
        history = [v for v in state.lanes.get(lane, []) if v != version] or [BUNDLED]
        state.lanes[lane] = [*history, version][-_HISTORY:]
        self._write_active(state)

    def rollback(self, lane: str) -> str:
        """Make the version before the active one active again; returns it."""
        state = self._active()
        history = state.lanes.get(lane, [])
        if len(history) < 2:
            raise VersionError(f"{lane} has no earlier version to roll back to (`blazar engine list`)")
        state.lanes[lane] = history[:-1]
        self._write_active(state)
        return history[-2]

    def remove(self, lane: str, version: str) -> None:
        if self.get(lane, version) is None:
            raise VersionError(f"{lane}@{version} is not installed")
        if self.active_name(lane) == version:
            raise VersionError(f"{lane}@{version} is active: `blazar engine use` another first")
        shutil.rmtree(self.root / lane / version)
        state = self._active()
        if lane in state.lanes:
            state.lanes[lane] = [v for v in state.lanes[lane] if v != version]
            self._write_active(state)

    def prune(self, lane: str) -> list[str]:
        """Remove every installed version but the active one and the one before it."""
        keep = set(self.history(lane)[-2:])
        gone = [v.version for v in self.installed() if v.lane == lane and v.version not in keep]
        for version in gone:
            self.remove(lane, version)
        return gone

    # -- installing -----------------------------------------------------

    def _dir(self, lane: str, version: str) -> Path:
        if self.get(lane, version) is not None:
            raise VersionError(f"{lane}@{version} is already installed")
        if not version or "/" in version or version.startswith(".") or version == BUNDLED:
            raise VersionError(f"{version!r} is not a version name")
        target = self.root / lane / version
        shutil.rmtree(target, ignore_errors=True)  # what a killed install left
        return target

    def install_wheel(self, lane: str, version: str) -> EngineVersion:
        """``DISTS[lane]==version`` from the package index into its own venv, every wheel
        installed only against the SHA-256 it had when it was downloaded."""
        dist = DISTS.get(lane)
        if dist is None:
            raise VersionError(f"the {lane} lane has no package on PyPI; install a binary with --from")
        target = self._dir(lane, version)
        work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=self._parent(lane)))
        try:
            wheels = work / "wheels"
            _run(
                [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-q", "-d", str(wheels),
                 f"{dist}=={version}"],
                f"downloading {dist}=={version}",
            )  # fmt: skip
            hashes = {w.name: _sha256(w) for w in sorted(wheels.iterdir())}
            pins = work / "requirements.txt"
            pins.write_text("".join(f"{wheels / name} --hash=sha256:{h}\n" for name, h in hashes.items()))
            _run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], "making the venv")
            python = work / "venv" / "bin" / "python"
            _run(
                [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index",
                 "--no-deps", "--require-hashes", "-r", str(pins)],
                f"installing {dist}=={version}",
            )  # fmt: skip
            purelib = _run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                "reading the venv",
            ).strip()
            # After the venv's own packages on sys.path: its engine wins; our code and what it
            # imports (msgspec, …) are found in the daemon's own environment.
            ours = dict.fromkeys(
                [str(code_root()), *(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))]
            )
            Path(purelib, "blazar-code.pth").write_text("".join(f"{p}\n" for p in ours))
            shutil.rmtree(wheels)
            pins.unlink()
            os.replace(work, target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        python = target / "venv" / "bin" / "python"
        return self._commit(
            EngineVersion(
                lane=lane, version=version, form="wheel", path=str(python), dist=dist, files=hashes,
                source=f"{dist}=={version} (package index)", installed_at=time.time(),
            )
        )  # fmt: skip

    def install_binary(self, lane: str, version: str, source: str, sha256: str) -> EngineVersion:
        """A binary from a path or an http(s) URL, kept only if its SHA-256 is ``sha256``."""
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
            raise VersionError("--sha256 must be the 64 hex digits of the file's SHA-256")
        target = self._dir(lane, version)
        work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=self._parent(lane)))
        try:
            name = Path(source.split("?")[0]).name or lane
            file = work / name
            if source.startswith(("http://", "https://")):
                import urllib.request  # only here: a daemon's start never downloads a binary

                with urllib.request.urlopen(source, timeout=60) as resp, open(file, "wb") as out:
                    shutil.copyfileobj(resp, out)
            else:
                shutil.copyfile(source, file)
            got = _sha256(file)
            if got != sha256.lower():
                raise VersionError(f"{source} has SHA-256 {got}, not the {sha256} given: not installed")
            file.chmod(0o755)
            os.replace(work, target)
        except OSError as exc:
            shutil.rmtree(work, ignore_errors=True)
            raise VersionError(f"cannot read {source}: {exc}") from exc
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        return self._commit(
            EngineVersion(
                lane=lane, version=version, form="binary", path=str(target / name), files={name: got},
                source=source, installed_at=time.time(),
            )
        )  # fmt: skip

    def _parent(self, lane: str) -> Path:
        parent = self.root / lane
        parent.mkdir(parents=True, exist_ok=True)
        return parent

    def _commit(self, version: EngineVersion) -> EngineVersion:
        manifest = self.root / version.lane / version.version / "manifest.json"
        manifest.write_bytes(msgspec.json.format(msgspec.json.encode(version)))  # last: it makes it a version
        return version

    # -- receipts -------------------------------------------------------

    def receipts(self) -> list[Receipt]:
        try:
            return msgspec.json.decode((self.root / "receipts.json").read_bytes(), type=list[Receipt])
        except (OSError, msgspec.DecodeError):
            return []

    def add_receipt(self, receipt: Receipt) -> None:
        kept = [*self.receipts(), receipt][-200:]
        atomic_write(self.root / "receipts.json", msgspec.json.encode(kept))


def bundled_version(lane: str) -> str | None:
    """The version of the lane's package in the daemon's own environment."""
    import importlib.metadata

    dist = DISTS.get(lane)
    try:
        return importlib.metadata.version(dist) if dist else None
    except importlib.metadata.PackageNotFoundError:
        return None
