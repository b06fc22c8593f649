PYTHON ?= python3
# An installed package runs from bytecode: with PYTHONDONTWRITEBYTECODE set (as some CI images do),
# every process the suite and the benchmarks start (CLI tests, Dask workers) compiles the project's
# hundred-odd modules again, about 0.1 s each time, and start-up figures measure that compile.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin
DEMO_TRACE := sample_traces/gpu_prefill_decode_eager.json.gz

.PHONY: demo test bench bench-cluster bench-formats parity docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/tracekit analyze $(DEMO_TRACE)

test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# one worker per core, at most four: the suite is mostly single-threaded Python and DuckDB per test
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/run.py

bench-cluster: $(VENV)/.installed
	$(BIN)/python benchmarks/cluster.py
	cd benchmarks && ../$(BIN)/python reduce_scale.py

bench-formats: $(VENV)/.installed
	$(BIN)/python benchmarks/formats.py

parity: $(VENV)/.installed
	$(BIN)/python benchmarks/hta_parity.py

docs: $(VENV)/.installed
	$(BIN)/python scripts/gen_rule_docs.py
	$(BIN)/python scripts/gen_schema_docs.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
