PY ?= .venv/bin/python
PIP ?= .venv/bin/pip

.PHONY: setup run test bench schemas simulate clean

setup: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

run: setup
	$(PY) -m timeshare.cli simulate examples/ai2-like/scenario.toml --out out/ai2-like

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) benchmarks/bench_sim.py

schemas: setup
	$(PY) -m timeshare.schemas schemas

clean:
	rm -rf out .pytest_cache
