PY ?= .venv/bin/python
UV ?= .venv/bin/uv
LOCK_FLAGS ?=
LOCK := $(UV) pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock'

.PHONY: venv lock dev lint types test test-unit check bench

# .venv exactly as CI tests it: every package from requirements/dev.txt (hash-checked,
# nothing resolved again), then llmgw itself, editable, on top.
venv:
	python3 -m venv .venv
	.venv/bin/python -m pip install -q --require-hashes --no-deps -r requirements/dev.txt
	.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	.venv/bin/python -m pip check

# Regenerates the locks from pyproject.toml, keeping every pin that still fits:
#   make lock                                   after changing a dependency in pyproject.toml
#   make lock LOCK_FLAGS=--upgrade              everything to its newest release
#   make lock LOCK_FLAGS='--upgrade-package X'  X alone
# then `make venv check`. requirements/runtime.txt (the image's) is dev.txt's subset.
lock:
	test -x $(UV) || $(MAKE) venv
	$(LOCK) $(LOCK_FLAGS) pyproject.toml requirements/build.in --extra dev -o requirements/dev.txt
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
TEST_WORKERS ?= auto

test:
	status=0; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m 'not serial' || status=$$?; \
	$(PY) -m pytest -q -m serial || { code=$$?; [ $$status -ne 0 ] || status=$$code; }; \
	exit $$status

test-unit:
	$(PY) -m pytest -q tests/unit

check: lint types test
