# Two entry points that work on a fresh machine: `make demo` and `make test`.
# TORCH sets the torch requirement installed first (the CPU build here; pick yours elsewhere).
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: demo test bench clean

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

bench: $(VENV)/.installed
	$(PY) tools/bench.py

clean:
	rm -rf $(VENV) data/sample
