# Every install step of the project lives here and in pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest

.PHONY: install browser ffmpeg models demo test test-fast test-slow check lint typecheck fmt clean bench bench-litellm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,mistralrs,speech]'
	touch $(STAMP)

install: $(STAMP)

# The test and demo model (SmolLM2-135M), fetched once by the project's own pull code.
models: $(STAMP)
	$(BIN)/python scripts/fetch_test_models.py

demo: install
	bash scripts/demo.sh

# The browser the web console's tests drive (Debian's chromium via apt): never fails the build,
# the browser tests skip with the reason where it cannot be installed.
browser:
	-sh scripts/setup-browser.sh

# ffmpeg (Debian's, via apt), which the piper host encodes mp3/opus/aac/flac with: never fails the
# build; without it those formats answer 400 and their tests skip with the reason.
ffmpeg:
	-sh scripts/setup-ffmpeg.sh

# The whole suite: unit, integration (real engine) and end-to-end (real daemon, official SDKs).
# pytest exits non-zero (5) when it collects no test, so an empty run can never pass.
test: models browser ffmpeg
	$(PYTEST) -q

test-fast: models browser ffmpeg
	$(PYTEST) -q -m "not slow"

test-slow: models browser ffmpeg
	$(PYTEST) -q -m slow

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
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[bench]'
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
