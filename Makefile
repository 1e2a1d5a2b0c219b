# Two entry points for a fresh machine: `make demo` (the demo call, SQLite, offline) and
# `make test` (the whole suite on SQLite and PostgreSQL). Each creates the virtualenv it needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

.PHONY: venv demo test bench postgres
venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/session-store demo

postgres:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; echo "PostgreSQL did not start" >&2; exit 1

test: $(STAMP) postgres
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25

bench: $(STAMP) postgres
	$(BIN)/python bench/append.py
