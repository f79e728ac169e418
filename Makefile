# Every install step of the project lives here and in pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest

# Python keeps the bytecode it compiles beside the sources. A shell that sets PYTHONDONTWRITEBYTECODE
# makes every daemon, engine host and CLI that the tests start compile each module it imports
# again: on a fresh clone that cost tests/e2e/test_cli.py 34 s instead of 21.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install lock test-latest browser ffmpeg nginx rpc-server rpc-server-optional models demo test test-fast test-slow check lint typecheck fmt clean bench bench-litellm

# Installs come from the lock (requirements/*.txt: exact versions with hashes, written by `make lock`),
# so a new machine runs what CI tested. uv itself is pinned by hash and installed with pip; `uv pip
# sync` then makes the venv exactly the lock (removing anything else), and the project goes in
# editable without touching the dependencies.
LOCK := requirements/dev.txt
UV   := $(BIN)/uv

$(STAMP): $(LOCK) requirements/uv.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --require-hashes -r requirements/uv.txt
	$(UV) pip sync -q --python $(BIN)/python --require-hashes $(LOCK)
	$(UV) pip install -q --python $(BIN)/python --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

# Writes the lock from pyproject.toml's ranges, for Python 3.11 (the oldest the project supports).
# uv keeps the versions the files already pin where the ranges still allow them: to move the lock,
# `make lock LOCK_ARGS=--upgrade` (everything) or `LOCK_ARGS="--upgrade-package tomlkit"` (one). dev.txt is what `make install` and CI use; runtime.txt is the daemon
# alone (what a user installs, docs/development.md); bench.txt adds the benchmark harness. The
# last two are constrained by dev.txt, so every file names the same version of a package.
LOCK_ARGS ?=
COMPILE = $(UV) pip compile -q --generate-hashes --python-version 3.11 $(LOCK_ARGS)
lock: $(STAMP)
	$(COMPILE) pyproject.toml --extra test --extra mistralrs --extra speech --extra pool -o requirements/dev.txt
	$(COMPILE) pyproject.toml --extra mistralrs --extra speech -c requirements/dev.txt -o requirements/runtime.txt
	$(COMPILE) pyproject.toml --extra test --extra mistralrs --extra speech --extra pool --extra bench \
		-c requirements/dev.txt -o requirements/bench.txt

# Drift, seen before users meet it: a scratch venv with the newest versions the ranges allow
# (not the lock), running the fast tier. Run it before moving the lock (docs/development.md).
LATEST_VENV := .cache/latest-venv
test-latest: $(STAMP) models
	rm -rf $(LATEST_VENV)
	$(UV) venv -q --python $(BIN)/python $(LATEST_VENV)
	$(UV) pip install -q --python $(LATEST_VENV)/bin/python --upgrade -e '.[test,mistralrs,speech,pool]'
	$(UV) pip list --python $(LATEST_VENV)/bin/python --format freeze > $(LATEST_VENV)/versions.txt
	$(LATEST_VENV)/bin/python -m pytest -q -m "not slow" $(XDIST)

# The test and demo model (SmolLM2-135M), fetched once by the project's own pull code.
models: $(STAMP)
	$(BIN)/python scripts/fetch_test_models.py

demo: install
	bash scripts/demo.sh

# The browser the web console's tests drive (Debian's chromium via apt): never fails the build,
# the browser tests fail with the reason where it cannot be installed (never a silent skip).
browser:
	-sh scripts/setup-browser.sh

# ffmpeg (Debian's, via apt), which the piper host encodes mp3/opus/aac/flac with: never fails the
# build; without it those formats answer 400 and their tests fail, naming `make ffmpeg`.
ffmpeg:
	-sh scripts/setup-ffmpeg.sh

# nginx (Debian's nginx-light, via apt), which the reverse-proxy streaming test puts in front of
# the daemon (run unprivileged, its config in a temporary folder): never fails the build; without
# it that test fails, naming `make nginx`.
nginx:
	-sh scripts/setup-nginx.sh

# llama.cpp's rpc-server (the worker `blazar rpc-worker` runs) and the RPC backend module the
# xllamacpp wheel lacks, built with cmake from the sdist of the xllamacpp version the lock pins,
# into ~/.cache/blazar/rpc-server/xllamacpp-<version>/ (about 2.5 minutes on 2 cores, once per
# version; nothing when cached). cmake and g++ come from Debian (scripts/setup-build-tools.sh,
# which never fails). The test setup takes it best effort: without cmake or a compiler it says
# why and goes on, and the RPC split tests skip, naming this target.
rpc-server: $(STAMP)
	-sh scripts/setup-build-tools.sh
	$(BIN)/python scripts/build_rpc_server.py

rpc-server-optional: $(STAMP)
	-sh scripts/setup-build-tools.sh
	-$(BIN)/python scripts/build_rpc_server.py --best-effort

# The whole suite: unit, integration (real engine) and end-to-end (real daemon, official SDKs).
# pytest exits non-zero (5) when it collects no test, so an empty run can never pass.
# One xdist worker per core, 4 at most (each runs its own daemons and engines); whole modules go
# to a worker (their daemons are module fixtures), in collection order, which tests/conftest.py
# makes longest first. TEST_JOBS=0 runs in one process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST := $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder)

test: models browser ffmpeg nginx rpc-server-optional
	$(PYTEST) -q $(XDIST)

test-fast: models browser ffmpeg nginx
	$(PYTEST) -q -m "not slow" $(XDIST)

test-slow: models browser ffmpeg nginx rpc-server-optional
	$(PYTEST) -q -m slow $(XDIST)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy
	cd sdk/python && ../../$(BIN)/mypy

check: lint typecheck test-fast

# Benchmarks (long: run on a quiet machine): results under bench/results/, then BENCHMARK.md.
# BENCH_ARGS passes options, e.g. `make bench BENCH_ARGS="--only overhead"`.
BENCH_ARGS ?=
LITELLM_VENV := .cache/bench/litellm-venv

bench: models bench-litellm
	$(UV) pip sync -q --python $(BIN)/python --require-hashes requirements/bench.txt
	$(UV) pip install -q --python $(BIN)/python --no-deps -e .
	rm -f $(STAMP)  # the venv is bench.txt now: the next install syncs it back to the dev lock
	$(BIN)/python -m bench run $(BENCH_ARGS)
	$(BIN)/python scripts/bench_report.py

# The LiteLLM proxy to compare with, in its own venv (in ours it would downgrade huggingface_hub
# and rich). Best effort: without it the overhead benchmark says so and goes on.
bench-litellm:
	-test -x $(LITELLM_VENV)/bin/litellm || ($(PYTHON) -m venv $(LITELLM_VENV) && \
		$(LITELLM_VENV)/bin/python -m pip install -q --disable-pip-version-check 'litellm[proxy]')

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
