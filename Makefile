.PHONY: demo test test-fast bench install clean-runs

VENV := .venv
PY := $(VENV)/bin/python

install:
	@bash scripts/install.sh

demo: install
	@$(PY) -m fedmem.cli demo

# The whole suite (what CI runs); the 25 slowest tests are listed at the end. Two pytest-xdist
# workers, one test file per worker at a time (--dist loadfile: a module's shared fixtures stay in
# one process; each worker starts its own private Ray and CrypTen parties), the longest files first
# (--no-loadscope-reorder keeps the order tests/conftest.py gives them). PYTEST_WORKERS=0 runs
# it in one process. PYTHONDONTWRITEBYTECODE is cleared for the run: with it set (as on the
# development machines), every worker re-runs pytest's assertion rewriting of every test module
# at collection (12 s instead of 7 s per worker, measured); the .pyc files go to __pycache__/
# (git-ignored).
PYTEST_WORKERS ?= 2
test: install
	@$(VENV)/bin/lint-imports --no-cache
	@PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q --durations=25 -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Development lane: everything but the tests marked slow (own clusters, subprocess runs).
test-fast: install
	@$(PY) -m pytest -q -m "not slow" --durations=10 $(PYTEST_ARGS)

# Every headline benchmark, with its machine line, into docs/benchmarks.md (scripts/bench_all.py;
# its docstring says how many repeats and why). BENCH_ARGS: e.g. --quick, --baseline REV, --out PATH.
bench: install
	@$(PY) scripts/bench_all.py $(BENCH_ARGS)

clean-runs:
	rm -rf runs
