#!/usr/bin/env bash
# Runs the whole system on this machine: the API under gunicorn and the daemons of the
# Procfile (relay, background worker, stuck-job monitor) under honcho: one terminal,
# prefixed logs, Ctrl-C stops them all. Automation workers are started on demand by the
# local machine provider when a job needs them.
# Called by `make run` after the environment, the database and migrations are ready.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export HOST=${HOST:-127.0.0.1}
export PORT=${PORT:-8000}
export PATH="$PWD/$BIN:$PATH"
# Where the automation workers started here reach the API.
export HUB_URL=${HUB_URL:-http://${HOST}:${PORT}}

python manage.py setup_broker
python manage.py seed_demo

echo "Hub DomMed API listening on http://${HOST}:${PORT}/ (docs: http://${HOST}:${PORT}/api/docs/)"
exec honcho start --no-colour -f Procfile
