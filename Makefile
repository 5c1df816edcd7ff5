# The two front doors: `make run` (the whole system) and `make test` (the whole suite).
# Both set everything up on a fresh machine: the virtual environment, the database, migrations.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint format migrate db install clean

# Reinstall only when the declared dependencies change: fast when already done.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

db: install
	$(BIN)/python scripts/ensure_database.py

migrate: db
	$(BIN)/python manage.py migrate --no-input

run: migrate
	HOST=$(HOST) PORT=$(PORT) BIN=$(BIN) scripts/run.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint db
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
