# Entry points that work on a fresh machine: `make demo`, `make test` (the checks, the docs site in
# strict mode, then every test, as CI), `make test-fast` (`pytest -m "not slow"`, the loop while
# developing), `make lint` (mypy, ruff check, ruff format --check) and `make docs` (the site into
# site/). `make demo` installs torch and the build extra; the others every extra.
# TORCH sets the torch requirement installed first (the CPU build here; pick yours elsewhere).
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0
# The peers (LitData, MosaicML Streaming) get their own venv: they pin numpy<2.2 and pull torchvision.
PEERS ?= .venv-peers
PEERS_ARGS ?= --features 9,64,256 --rounds 2

.PHONY: demo docs lint test test-fast bench bench-peers clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# The demo needs torch and the build extra only (dask, pyarrow, databento-dbn), not the test tools: its
# own stamp, met by a venv that already has everything (.installed) too.
$(VENV)/.installed-demo: pyproject.toml
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then touch $@; else \
	  echo "make demo: installing torch (CPU) and shardcache[build] into $(VENV): about 1.5 minutes and 1.2 GB on a fresh machine (the test tools are not needed)"; \
	  python3 -m venv $(VENV) && \
	  $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q "$(TORCH)" && \
	  $(PY) -m pip install -q -e ".[build]" && touch $@; fi

demo: $(VENV)/.installed-demo
	$(VENV)/bin/shardcache demo

# strict: a warning (a broken link or anchor, a docstring mkdocstrings cannot read) fails the build
# (no --quiet: it drops the warnings before strict mode counts them, and the build passed)
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# mypy strict on shardcache/ (its config in pyproject.toml); ruff's lint and its formatting on the code,
# the tools and the tests: any finding fails the target, and `make test` with it
lint: $(VENV)/.installed
	$(VENV)/bin/mypy
	$(VENV)/bin/ruff check shardcache tools tests
	$(VENV)/bin/ruff format --check shardcache tools tests

test: $(VENV)/.installed lint docs
	$(PY) -m pytest -q -ra

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -ra -m "not slow"

bench: $(VENV)/.installed
	$(PY) tools/bench.py loaders

# torch pinned by the constraints file; a torchvision that cannot load against it (PyPI's CUDA
# wheel on the CPU torch) is uninstalled, openly: see tools/peers-constraints.txt.
$(PEERS)/.installed: pyproject.toml tools/peers-constraints.txt
	python3 -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --upgrade pip
	$(PEERS)/bin/python -m pip install -q -c tools/peers-constraints.txt -e . litdata mosaicml-streaming
	$(PEERS)/bin/python -c "import torchvision" 2>/dev/null || { \
	  echo "bench-peers: torchvision cannot load against this torch (a CUDA wheel on a CPU torch): uninstalling it"; \
	  $(PEERS)/bin/python -m pip uninstall -q -y torchvision; }
	touch $@

bench-peers: $(PEERS)/.installed
	$(PEERS)/bin/python tools/bench.py peers $(PEERS_ARGS)

clean:
	rm -rf $(VENV) $(PEERS) data/sample site .mypy_cache .ruff_cache
