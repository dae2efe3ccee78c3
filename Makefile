# Entry points that work on a fresh machine: `make demo`, `make test` (everything, as CI) and
# `make test-fast` (`pytest -m "not slow"`, the loop while developing). All install every extra.
# TORCH sets the torch requirement installed first (the CPU build here; pick yours elsewhere).
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: demo test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/shardcache demo

test: $(VENV)/.installed
	$(PY) -m pytest -q -ra

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -ra -m "not slow"

bench: $(VENV)/.installed
	$(PY) tools/bench.py

clean:
	rm -rf $(VENV) data/sample
