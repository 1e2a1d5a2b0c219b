# Two entry points for a fresh machine: `make demo` (the demo call, SQLite, offline) and
# `make test` (the whole suite on SQLite and PostgreSQL). Each creates the virtualenv it needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@echo "installing the dependencies into $(VENV) (about a minute the first time)..."
	$(BIN)/pip install --progress-bar off -e '.[dev]'
	touch $(STAMP)

.PHONY: venv demo demo-fleet test bench postgres
venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/session-store demo

# The phone bot example as a fleet: 3 workers, 20 calls, one worker SIGKILLed mid-tool-call
# (examples/phone_bot/fleet.py). DB=sqlite runs the workers on one SQLite file instead.
# The database is kept (./demo-fleet, or a schema of its own on PostgreSQL);
# FLEET_ARGS="--pg-url postgresql://user@host/db" writes elsewhere, "--clean" deletes it.
DB ?= postgres
CALLS ?= 20
demo-fleet: $(STAMP) $(if $(filter postgres,$(DB)),postgres)
	$(BIN)/python -m examples.phone_bot.fleet --db $(DB) --calls $(CALLS) $(FLEET_ARGS)

postgres:
	@pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; echo "PostgreSQL did not start" >&2; exit 1

test: $(STAMP) postgres
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 4 --durations=25

bench: $(STAMP) postgres
	$(BIN)/python bench/append.py
