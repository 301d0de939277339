# timeshare — the two commands a newcomer needs: `make run` and `make test` (README.md, "Setup").
PY ?= .venv/bin/python
PIP ?= .venv/bin/pip
PYTHON ?= python3

# what `make setup` says last (only when asked for by name: `make run` and `make test` set up first)
NEXT = ready: make run starts the live stack and make test runs the tests; README.md walks through the first ten minutes

.PHONY: setup run simulate test test-fast bench bench-scale compiled bench-live bench-tree-live bench-report bench-ledger-report bench-failover chaos schemas screenshots clean

# also builds the compiled core (mypyc) that `timeshare simulate` uses when it exists; without a
# C compiler it says so and everything runs in pure Python
setup: .venv/.installed
	@$(PY) benchmarks/compiled.py >/dev/null 2>&1 || echo "note: the compiled core could not be built; timeshare simulate runs pure Python"
	$(if $(filter setup,$(MAKECMDGOALS)),@echo "$(NEXT)")

.venv/.installed: pyproject.toml
	$(PYTHON) -m venv .venv
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

# The live stack: NATS JetStream + PostgreSQL + every service + a demo cluster and a steady
# flow of synthetic submissions. Prints the gateway URL; Ctrl-C stops everything.
run: setup
	$(PY) -m services.devstack

# The built-in 30-day scenario under every policy, with report.html.
simulate: setup
	$(PY) -m timeshare.cli simulate examples/ai2-like/scenario.toml --out out/ai2-like

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: setup
	@$(PY) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-fast: setup
	$(PY) -m pytest -m "not slow and not integration"

# pure Python and the compiled core (built first if missing), side by side; prints, never asserts
bench: setup
	$(PY) benchmarks/bench_sim.py

# how the core's cost grows with the tree (1k, 10k leaves) and the pool (1,024 vs 16,384 GPUs, 3 days), the 16k month
# (about 2.5 min) and the user's path (the built-in month through `timeshare simulate`), in "loops" (a 10M-iteration
# Python loop in the same process); prints, never asserts. SCALE_ARGS="--month '' --user-path 0" for the quick parts
bench-scale: setup
	$(PY) benchmarks/bench_scale.py $(SCALE_ARGS)

# the scheduling core compiled with mypyc into .build/mypyc/<hash>/ (docs/records/2026-11-measurements.md, "Speed: the compiled core")
compiled: setup
	$(PY) benchmarks/compiled.py

bench-live: setup
	$(PY) benchmarks/bench_live.py

# a 10,000-leaf tree through the live stack: one PUT adding 1,000 leaves, placement's health
# during it, placement killed and started again; prints, never asserts
bench-tree-live: setup
	$(PY) benchmarks/bench_tree_live.py

# faults under a steady flow: nats-server, PostgreSQL and each service killed and restarted;
# prints recovery times and checks 0 lost / 0 duplicated (services/devstack/chaos.py; a reduced
# run is in tests/integration/test_self_healing.py). CHAOS_ARGS="--rate 20 --down 10" etc.
chaos: setup
	$(PY) -m services.devstack.chaos $(CHAOS_ARGS)

bench-report: setup
	$(PY) benchmarks/bench_report.py

# the ledger's report over a simulated month: hourly rows against the whole journal (prints)
bench-ledger-report: setup
	$(PY) benchmarks/bench_ledger_report.py

# placement failover at 10k and 100k events: full replay, snapshot + the rest, with ended work
# kept or forgotten after 1 h / 10 min (a real nats-server; prints)
bench-failover: setup
	$(PY) benchmarks/bench_failover.py

# the dashboard's browser test (Debian's chromium) against a live stack, keeping its screenshots
# in docs/screenshots/ (the README shows them)
screenshots: setup
	TIMESHARE_SCREENSHOTS=docs/screenshots $(PY) -m pytest -q tests/integration/test_dashboard.py

schemas: setup
	$(PY) -m timeshare.cli schemas schemas
	$(PY) -m services.schemas schemas

clean:
	rm -rf out .pytest_cache .build
