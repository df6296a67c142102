.PHONY: demo test install clean-runs

VENV := .venv
PY := $(VENV)/bin/python

install:
	@bash scripts/install.sh

demo: install
	@$(PY) -m fedmem.cli demo

test: install
	@$(PY) -m pytest -q $(PYTEST_ARGS)

clean-runs:
	rm -rf runs
