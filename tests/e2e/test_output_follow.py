"""A running job's output followed live by fifty clients, every process real: the API
(gunicorn), the stream process (uvicorn) and the automation worker are restarted while the
command prints, and every follower still gets every line once, in order."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import requests
from django.utils import timezone

from identity.tokens import issue_access_token
from job.models import Job
from tests.e2e.conftest import System, ticking
from tests.polling import wait_until
from tests.servers import api_server, stop_all, stream_server
from tests.sse import Follower

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LINES = 100
# A line every 100 ms for 10 s, each with the time it was printed.
TICKING = ticking(LINES)
FOLLOWERS = 50


def me_latency(api_url: str, headers: dict[str, str], rounds: int = 20) -> float:
    """The median time of ``GET /api/v1/me``, in seconds."""
    times = []
    with requests.Session() as session:
        for _ in range(rounds):
            started = time.perf_counter()
            assert session.get(f"{api_url}/api/v1/me", headers=headers, timeout=10).ok
            times.append(time.perf_counter() - started)
    return statistics.median(times)


@pytest.mark.timeout(300)
def test_fifty_followers_see_every_line_once_across_restarts_of_the_api_stream_and_worker(
    settings, catalog, person, tmp_path
):
    api = api_server(settings, tmp_path, WEB_CONCURRENCY="2").start()
    stream = stream_server(settings, tmp_path).start()
    machines = tmp_path / "machines"
    machines.mkdir()
    system = System(api.url, machines, tmp_path)
    headers = {"Authorization": f"Bearer {issue_access_token(person).token}"}
    created = catalog("ticking", command=TICKING)
    worker_env = {"AGENT_POLL_INTERVAL": "0.3", "WORKER_STOP_BUDGET": "30"}
    followers: list[Follower] = []

    def logs() -> str:
        return f"{api.log_text()}\n{stream.log_text()}\n{system.log_text()}"

    try:
        first_worker = system.automation_worker("ticking", created.credential, **worker_env)
        quiet_latency = me_latency(api.url, headers)
        response = requests.post(
            f"{api.url}/api/v1/jobs",
            json={"automation": created.automation.id, "params": {}},
            headers=headers,
            timeout=10,
        )
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        url = f"{stream.url}/api/v1/jobs/{job_id}/output/stream"
        followers = [Follower(url, headers).start() for _ in range(FOLLOWERS)]

        wait_until(lambda: all(f.text() for f in followers), timeout=60, message=lambda: logs())
        busy_latency = me_latency(api.url, headers)
        first = followers[0]
        first_line = first.text().splitlines()[0]
        first_delay = first.events[0].received_at - float(first_line.split()[2])

        # While the command prints: the worker (which lets its running command finish
        # before it exits), the stream process, then the API.
        first_worker.terminate()
        worker_stopped_at = timezone.now()
        system.automation_worker("ticking", created.credential, **worker_env)
        restarts = [threading.Thread(target=server.restart) for server in (stream, api)]
        servers_stopped_at = timezone.now()
        for restart in restarts:
            restart.start()
        for restart in restarts:
            restart.join(60)
        running_after_restarts = Job.objects.get(pk=job_id).status == "running"

        wait_until(
            lambda: all(f.ended.is_set() for f in followers),
            timeout=120,
            message=lambda: f"{[len(f.text()) for f in followers]}\n{logs()}",
        )
    finally:
        for follower in followers:
            follower.stop()
        system.stop()
        stop_all(stream, api)

    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded", logs()
    # Every restart began while the command ran.
    assert worker_stopped_at < servers_stopped_at < job.finished_at
    expected = [["tick", str(n)] for n in range(LINES)]
    for follower in followers:
        lines = follower.text().splitlines()
        assert [line.split()[:2] for line in lines] == expected, (
            f"answers {follower.statuses}, events {[(e.id, e.name) for e in follower.events]}"
            f"\n{stream.log_text()[-4000:]}"
        )
        assert follower.events[-1].name == "end"
        assert follower.events[-1].json["status"] == "succeeded"
    # The stream process's restart broke every stream: each follower came back.
    assert all(f.connections >= 2 for f in followers), [f.connections for f in followers]
    # Figures, not bounds (the machine is shared): bench/output_follow.py measures them.
    print(
        f"first line {first_delay:.3f} s after its print; GET /me median "
        f"{quiet_latency * 1000:.1f} ms alone, {busy_latency * 1000:.1f} ms beside "
        f"{FOLLOWERS} followers; still running after the restarts: {running_after_restarts}"
    )
