# The two front doors: `make run` (the whole system) and `make test` (the whole suite).
# Both set everything up on a fresh machine: the virtual environment, the database, migrations.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

# Python keeps the bytecode it compiles (__pycache__, ignored by git) even where the
# environment says not to: the suite and `make run` start hundreds of Python processes
# (daemons, servers, test workers), and each would compile the project's modules again.
unexport PYTHONDONTWRITEBYTECODE

# The suite's processes (pytest-xdist). Most of the suite waits on PostgreSQL, RabbitMQ and
# subprocesses, not on a core: more workers than cores pays off.
TEST_WORKERS ?= 4

.PHONY: run admin test suite chaos lint format migrate db install clean

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

# exec: the script, which turns a Ctrl-C into a clean stop, is the recipe's only process (a
# shell waiting for it would die of the Ctrl-C first, and make say "Interrupt").
run: migrate
	HOST=$(HOST) PORT=$(PORT) BIN=$(BIN) exec scripts/run.sh

# The first platform admin (asks for an email and a password), in the virtual environment.
admin: migrate
	$(BIN)/python manage.py createsuperuser

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# `make test` runs the suite and says how long it took in all (lint and setup included).
test:
	@started=$$(date +%s); $(MAKE) --no-print-directory suite; status=$$?; \
	echo "make test: $$(( $$(date +%s) - started )) s in all"; exit $$status

# The tests of one file run on one worker, the reliability scenarios all on one
# (tests/conftest.py groups them); TEST_WORKERS=0 runs everything in this one process.
suite: lint db
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# The reliability suite at full size: 10,000 jobs under relay kills, 30-s outages, poison
# rows, crashed workers, and the 30-minute soak, which runs beside the other scenarios
# (about 40 minutes in all; its output is kept in var/reliability/soak.log and shown at the
# end). `make test` runs the quick form of the same scenarios, without the soak.
chaos: db
	@mkdir -p var/reliability
	@CHAOS=full $(BIN)/python -m pytest tests/reliability/test_soak.py -v -p no:cacheprovider \
		> var/reliability/soak.log 2>&1 & soak=$$!; \
	CHAOS=full $(BIN)/python -m pytest tests/reliability -v --ignore=tests/reliability/test_soak.py \
		$(PYTEST_ARGS); scenarios=$$?; \
	wait $$soak; soaked=$$?; \
	echo "--- the soak (var/reliability/soak.log)"; cat var/reliability/soak.log; \
	test $$scenarios -eq 0 -a $$soaked -eq 0

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
