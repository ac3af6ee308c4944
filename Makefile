# The two set-up commands on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export FEDFLOCK_DATA ?= $(abspath ../shared/data)

.PHONY: demo test lint docs install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned, so pip takes the local CPU build instead of a CUDA one.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo  # the demo's own output: a second `make demo` starts afresh
	$(BIN)/fedflock compare configs/demo.yaml --algorithms cfl,fedavg --out runs/demo
	$(BIN)/fedflock report runs/demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples mkdocs_hooks.py
	$(BIN)/lint-imports
	$(BIN)/python -m benchmarks.reproduce render --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .docs-check
	rm -rf .docs-check
	$(BIN)/python -m pytest --durations=15

# The documentation site into site/ (strict: a broken link or a missing page fails), after
# checking that every published table is the rendering of its committed rows.
docs: $(STAMP)
	$(BIN)/python -m benchmarks.reproduce render --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples mkdocs_hooks.py
	$(BIN)/lint-imports

clean:
	rm -rf runs .pytest_cache site .docs-check
