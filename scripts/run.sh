#!/usr/bin/env bash
# Runs the whole system on this machine: the API under gunicorn, and the daemons.
# Called by `make run` after the environment, the database and migrations are ready.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
WORKERS=${WEB_CONCURRENCY:-2}

echo "Hub DomMed API listening on http://${HOST}:${PORT}/ (docs: http://${HOST}:${PORT}/api/docs/)"
exec "$BIN/gunicorn" hubdommed.wsgi:application \
  --bind "${HOST}:${PORT}" --workers "$WORKERS" --access-logfile - --log-level info
