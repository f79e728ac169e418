"""Builds llama.cpp's RPC pieces from the sources of the installed xllamacpp (``make rpc-server``).

Two things, from one source so that their wire protocol matches:

* ``ggml-rpc-server``: the worker that ``blazar rpc-worker`` runs (a static binary, CPU
  backend, for x86-64 with AVX2 as the wheel is: ``-DGGML_NATIVE=OFF``);
* ``client/libggml-rpc.so`` (with the ``libggml-base.so.0`` it links): the RPC client as a ggml
  backend module, which the wheel's host loads to split a model over workers (the wheel has
  no RPC backend of its own; ``actors/engines/rpc_backend.py``).

The source is xllamacpp's sdist, which vendors the exact llama.cpp its wheel was built from:
the version is the one the lock pins (requirements/dev.txt, the one place), and the sdist's
sha256 must be one of the lock's hashes for it. The result is cached in
``${XDG_CACHE_HOME:-~/.cache}/blazar/rpc-server/xllamacpp-<version>/``, where ``blazar
rpc-worker`` and the host find it; a second run finds it there and does nothing.

Needs cmake and a C++ compiler (Debian: ``apt-get install cmake g++``). ``--best-effort``
(what ``make test`` uses) says why it cannot build and exits 0: the RPC tests then skip,
naming ``make rpc-server``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.engines.rpc_backend import MODULE, SERVER, build_dir, wheel_version  # noqa: E402

LOCK = ROOT / "requirements" / "dev.txt"
JOBS = os.environ.get("RPC_BUILD_JOBS", "2")
COMMON = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DGGML_NATIVE=OFF",  # portable: AVX2/FMA/F16C, as the wheel's CPU backend
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
]
WORKER = [*COMMON, "-DBUILD_SHARED_LIBS=OFF"]
CLIENT = [
    *COMMON,
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",  # libggml-rpc.so finds libggml-base.so.0 beside it
]


class BuildError(Exception):
    pass


def say(line: str) -> None:
    print(f"build_rpc_server: {line}", file=sys.stderr, flush=True)


def pinned_hashes(version: str) -> set[str]:
    """The lock's sha256 hashes for ``xllamacpp==version`` (wheels and sdist)."""
    text = LOCK.read_text()
    found = re.search(rf"^xllamacpp=={re.escape(version)}((?:\s*\\\s*--hash=sha256:[0-9a-f]+)+)", text, re.M)
    if not found:
        raise BuildError(f"{LOCK.relative_to(ROOT)} does not pin xllamacpp=={version}")
    return set(re.findall(r"sha256:([0-9a-f]{64})", found.group(1)))


def download(version: str, into: Path) -> Path:
    """The sdist, through pip (it honours the user's index settings), checked against the lock."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            "--no-binary", "xllamacpp", f"xllamacpp=={version}", "-d", str(into)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    sdists = list(into.glob("xllamacpp-*.tar.gz"))
    if done.returncode != 0 or not sdists:
        said = done.stderr.strip()[-500:]
        raise BuildError(f"pip could not download the xllamacpp {version} sdist: {said}")
    digest = hashlib.sha256(sdists[0].read_bytes()).hexdigest()
    if digest not in pinned_hashes(version):
        raise BuildError(f"{sdists[0].name} has sha256 {digest}, which the lock does not pin")
    return sdists[0]


def extract_llamacpp(sdist: Path, into: Path) -> Path:
    """Only the vendored llama.cpp (``thirdparty/llama.cpp``) of the sdist."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/thirdparty/llama.cpp/" in m.name]
        tar.extractall(into, members=members, filter="data")
    found = list(into.glob("*/thirdparty/llama.cpp/CMakeLists.txt"))
    if not found:
        raise BuildError(f"{sdist.name} vendors no llama.cpp (thirdparty/llama.cpp)")
    return found[0].parent


def cmake(source: Path, build: Path, flags: list[str], target: str, log: Path) -> None:
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = (
        [*nice, "cmake", "-S", str(source), "-B", str(build), *generator, *flags],
        [*nice, "cmake", "--build", str(build), "--target", target, "-j", JOBS],
    )
    with log.open("a") as out:
        for argv in steps:
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode != 0:
                tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
                raise BuildError(f"`{' '.join(argv[len(nice) :][:4])} …` failed (log: {log}):\n{tail}")


def build(version: str, dest: Path) -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        names = " and ".join(missing)
        raise BuildError(f"{names} not found: install them (Debian: apt-get install cmake g++)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=dest.parent) as scratch:
        work = Path(scratch)
        log = dest.parent / f"{dest.name}.log"
        log.write_text("")
        say(f"downloading the xllamacpp {version} sdist (it vendors the wheel's llama.cpp)")
        source = extract_llamacpp(download(version, work), work / "src")
        say(f"building {SERVER} with -j{JOBS} (log: {log})")
        cmake(source, work / "worker", WORKER, "ggml-rpc-server", log)
        say(f"building {MODULE}")
        cmake(source, work / "client", CLIENT, "ggml-rpc", log)
        staged = work / "out"
        (staged / MODULE).parent.mkdir(parents=True)
        shutil.copy2(work / "worker" / "bin" / SERVER, staged / SERVER)
        built = work / "client" / "bin"
        shutil.copy2(built / Path(MODULE).name, staged / MODULE)
        base = built / "libggml-base.so.0"
        shutil.copy2(base.resolve(), (staged / MODULE).parent / base.name)
        probe = subprocess.run([str(staged / SERVER), "--help"], capture_output=True, text=True, check=False)
        if "--port" not in probe.stdout + probe.stderr:
            raise BuildError(f"the built {SERVER} does not run: {(probe.stdout + probe.stderr)[-300:]}")
        header = (source / "ggml" / "include" / "ggml-rpc.h").read_text()
        proto = ".".join(re.findall(r"RPC_PROTO_\w+_VERSION\s+(\d+)", header))
        info = {"source": f"xllamacpp=={version} sdist", "rpc_protocol": proto, "flags": WORKER}
        (staged / "build.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        staged.rename(dest)  # whole or not at all: the cache check looks for the files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", help="xllamacpp version (default: the installed one)")
    parser.add_argument("--best-effort", action="store_true", help="say why it cannot build, exit 0")
    parser.add_argument("--force", action="store_true", help="build again even when cached")
    args = parser.parse_args()
    version = args.version or wheel_version()
    if version is None:
        say("xllamacpp is not installed: nothing to build against (make install first)")
        return 0 if args.best_effort else 1
    dest = build_dir(version)
    if not args.force and (dest / SERVER).is_file() and (dest / MODULE).is_file():
        say(f"cached: {dest}")
        return 0
    started = time.monotonic()
    try:
        build(version, dest)
    except (BuildError, OSError) as exc:
        say(f"cannot build llama.cpp's rpc-server: {exc}")
        if args.best_effort:
            say("going on without it: the RPC split tests will skip, naming `make rpc-server`")
            return 0
        return 1
    say(f"built {dest} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
