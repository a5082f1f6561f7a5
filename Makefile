PY ?= .venv/bin/python

.PHONY: venv dev lint types test test-unit check bench

venv:
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[dev]'

dev:
	test -x .venv/bin/llmgw-dev || $(MAKE) venv
	.venv/bin/llmgw-dev

lint:
	$(PY) -m ruff check app agent cli wire devcluster tests benchmarks
	$(PY) -m ruff format --check app agent cli wire devcluster tests benchmarks

types:
	$(PY) -m mypy

test:
	$(PY) -m pytest -q

test-unit:
	$(PY) -m pytest -q tests/unit

check: lint types test
