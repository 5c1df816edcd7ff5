#!/usr/bin/env bash
# Runs the whole system on this machine: the API under gunicorn and the daemons of the
# Procfile (relay, background worker, stuck-job monitor, scheduler) under honcho: one terminal,
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

# Waits (BROKER_WAIT_SECONDS, 60) for a broker still starting, saying what it waits for.
python manage.py setup_broker
python manage.py seed_demo
# The admin's and the API docs' files, for gunicorn to serve (WhiteNoise) when DEBUG is off.
python manage.py collectstatic --no-input --verbosity 0

# Automation workers the local provider started run detached (machines of their own); when
# this whole system stops, they stop with it.
stop_local_machines() {
  for pid_file in "${LOCAL_MACHINES_DIR:-var/machines}"/*.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    # Only if that pid is still one of our workers (pids get reused).
    if grep -qs run_worker "/proc/$pid/cmdline"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
}
trap stop_local_machines EXIT

echo "Hub DomMed API listening on http://${HOST}:${PORT}/ (docs: http://${HOST}:${PORT}/api/docs/)"
# honcho gives each Procfile line its own PORT, 100 apart in the Procfile's order, and each
# daemon serves its metrics on its own: two `make run`s side by side collide only when their
# PORTs are 100, 200, 300 or 400 apart.
metrics_host=${METRICS_HOST:-127.0.0.1}
echo "Metrics: api http://${HOST}:${PORT}/metrics, relay http://${metrics_host}:$((PORT + 100))/metrics," \
  "worker http://${metrics_host}:$((PORT + 200))/metrics, monitor http://${metrics_host}:$((PORT + 300))/metrics," \
  "scheduler http://${metrics_host}:$((PORT + 400))/metrics"
# No env file for honcho: it would override the real environment with .env (a PORT or
# DATABASE_URL given on the command line ignored); the processes read .env themselves,
# where the real environment wins.
honcho start --no-colour -f Procfile -e /dev/null
