#!/usr/bin/env bash
# Runs the whole system on this machine: the API under gunicorn and the daemons of the
# Procfile, under honcho (one terminal, prefixed logs, Ctrl-C stops them all).
# Called by `make run` after the environment, the database and migrations are ready.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
export HOST=${HOST:-127.0.0.1}
export PORT=${PORT:-8000}
export PATH="$PWD/$BIN:$PATH"

echo "Hub DomMed API listening on http://${HOST}:${PORT}/ (docs: http://${HOST}:${PORT}/api/docs/)"
exec honcho start --no-colour -f Procfile
