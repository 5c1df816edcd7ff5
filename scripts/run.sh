#!/usr/bin/env bash
# Runs the whole system on this machine: the API under gunicorn and the daemons of the
# Procfile (relay, background worker, stuck-job monitor, scheduler, the live streams under
# uvicorn) under honcho: one terminal,
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

# Automation workers the local provider started run detached (machines of their own, out of
# reach of the terminal's Ctrl-C); when this whole system stops, they stop with it, before
# this script returns: nothing started here outlives `make run`.
machines_dir=${LOCAL_MACHINES_DIR:-var/machines}
stop_budget=${WORKER_STOP_BUDGET:-30}
# The process groups a stop waits for (set when it begins).
groups=""

local_workers() {
  for pid_file in "$machines_dir"/*.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    # Only if that pid is still one of our workers (pids get reused).
    if grep -qs run_worker "/proc/$pid/cmdline"; then echo "$pid"; fi
  done
}

# Each worker and the commands it runs, each in a session (and process group) of its own.
local_groups() {
  for pid in $(local_workers); do
    echo "$pid"
    ps -o pid= --ppid "$pid" || true
  done
}

# Whether any process of that group still runs (a zombie waiting for its parent does not).
group_running() {
  ps -e -o pgid=,stat= | awk -v group="$1" '$1 == group && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# At once: every process of those groups. A SIGKILL is only asked for when kill returns; the
# wait for the groups to be gone is the caller's.
kill_local_machines() {
  for group in $groups $(local_groups); do
    kill -KILL -- "-$group" 2>/dev/null || kill -KILL "$group" 2>/dev/null || true
  done
}

# Asked to stop: a running job finishes within the stop budget and its outcome is kept on
# disk for the next start (docs/machines.md); a second Ctrl-C stops them all at once.
stop_local_machines() {
  # The second Ctrl-C's handler comes first: it may arrive as soon as the line below is read.
  trap 'kill_local_machines' INT TERM
  groups=$(local_groups | tr '\n' ' ')
  pids=$(local_workers | tr '\n' ' ')
  [ -n "$pids" ] || return 0
  echo "Stopping the automation workers (pids ${pids% }): a running job has up to ${stop_budget} s" \
    "to finish and is reported at the next start; Ctrl-C again stops them now."
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + ${stop_budget%.*} + 10))
  # Back only when no process of theirs runs any more, commands included.
  while [ -n "$(local_workers)" ] || any_group_running; do
    if [ "$SECONDS" -ge "$deadline" ]; then kill_local_machines; fi
    # A second Ctrl-C reaches this sleep too: not an error of the script's.
    sleep 0.1 || true
  done
}

any_group_running() {
  for group in $groups; do
    if group_running "$group"; then return 0; fi
  done
  return 1
}
trap stop_local_machines EXIT

echo "Hub DomMed API listening on http://${HOST}:${PORT}/ (docs: http://${HOST}:${PORT}/api/docs/)"
# honcho gives each Procfile line its own PORT, 100 apart in the Procfile's order, and each
# daemon serves its metrics on its own: two `make run`s side by side collide only when their
# PORTs are 100, 200, 300, 400 or 500 apart.
echo "Live streams (GET /api/v1/jobs/{id}/output/stream) on http://${HOST}:$((PORT + 500))/"
metrics_host=${METRICS_HOST:-127.0.0.1}
echo "Metrics: api http://${HOST}:${PORT}/metrics, relay http://${metrics_host}:$((PORT + 100))/metrics," \
  "worker http://${metrics_host}:$((PORT + 200))/metrics, monitor http://${metrics_host}:$((PORT + 300))/metrics," \
  "scheduler http://${metrics_host}:$((PORT + 400))/metrics"
# No env file for honcho: it would override the real environment with .env (a PORT or
# DATABASE_URL given on the command line ignored); the processes read .env themselves,
# where the real environment wins.
#
# Ctrl-C reaches honcho too, which stops its processes; a SIGTERM to this script alone is
# passed on. honcho ends in 130 or 143 when a signal stopped it (a process that died on its
# own ends it with that process's code): a stop asked for ends this script in 0, and make
# prints no error for it.
trap ':' INT
trap 'kill -TERM "$honcho" 2>/dev/null || true' TERM
honcho start --no-colour -f Procfile -e /dev/null &
honcho=$!
while :; do
  status=0
  wait "$honcho" || status=$?
  # Back early when a signal came: wait for honcho to finish stopping.
  kill -0 "$honcho" 2>/dev/null || break
done
trap - INT TERM
stop_local_machines
trap - EXIT
if [ "$status" -eq 130 ] || [ "$status" -eq 143 ]; then
  exit 0
fi
exit "$status"
