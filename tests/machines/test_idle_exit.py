"""An idle automation worker lets go of its machine before its last look for jobs."""

from __future__ import annotations

import sys

from automation.agent.client import AutomationInfo, ClaimRefused
from automation.agent.worker import AutomationWorker


class RecordingHub:
    """The hub as the worker sees it, in memory: what was asked, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.pending: list[int] = []
        self.reports: dict[int, str] = {}

    def pending_jobs(self, *, limit: int) -> list[dict]:
        self.calls.append("poll")
        return [{"id": job_id, "traceparent": ""} for job_id in self.pending]

    def claim(self, job_id: int, *, claim_token: str | None = None) -> dict:
        self.calls.append(f"claim {job_id}")
        if job_id not in self.pending:
            raise ClaimRefused("taken", status=409, code="not_pending")
        self.pending.remove(job_id)
        return {"id": job_id, "claim_token": claim_token or "t", "params": {}}

    def heartbeat(self, job_id, token, progress=None) -> dict:
        return {"cancel_requested": False}

    def output(self, job_id, token, *, seq, text) -> dict:
        return {"job": job_id, "seq": seq, "stored": True}

    def complete(self, job_id, token, **report) -> None:
        self.reports[job_id] = "complete"

    def fail(self, job_id, token, **report) -> None:
        self.reports[job_id] = "fail"


def automation() -> AutomationInfo:
    return AutomationInfo(
        id=1,
        slug="idle",
        command=[sys.executable, "-c", "pass"],
        timeout_seconds=30,
        max_concurrency=1,
    )


def test_going_idle_releases_the_machine_then_runs_what_the_last_poll_finds():
    hub = RecordingHub()

    def release_machine():
        hub.calls.append("release")
        hub.pending.append(7)  # a job created just as the worker went idle

    worker = AutomationWorker(hub, automation(), poll_interval=60, idle_timeout=0.2)
    stats = worker.run(release_machine=release_machine)

    assert hub.calls.index("release") < hub.calls.index("poll", 1)
    assert hub.reports == {7: "complete"}
    assert stats.claimed == 1 and stats.succeeded == 1
    assert hub.calls.count("release") == 1


def test_an_idle_worker_with_nothing_left_stops():
    hub = RecordingHub()
    released = []
    worker = AutomationWorker(hub, automation(), poll_interval=60, idle_timeout=0.2)

    stats = worker.run(release_machine=lambda: released.append(True))

    assert released == [True]
    assert stats.claimed == 0


def test_a_job_found_after_the_machine_was_let_go_is_run_once_it_is_taken_back():
    hub = RecordingHub()

    def release_machine():
        hub.calls.append("release")
        if hub.calls.count("release") == 1:
            hub.pending.append(7)

    def reclaim_machine():
        hub.calls.append("reclaim")
        return True

    worker = AutomationWorker(hub, automation(), poll_interval=60, idle_timeout=0.2)
    stats = worker.run(release_machine=release_machine, reclaim_machine=reclaim_machine)

    assert hub.calls.index("release") < hub.calls.index("reclaim") < hub.calls.index("claim 7")
    assert hub.reports == {7: "complete"}
    assert stats.claimed == 1
    # Its own again, the machine is let go of again once the worker is idle.
    assert hub.calls.count("release") == 2


def test_a_job_found_after_another_worker_took_the_machine_is_left_to_that_worker():
    # The job's power-on came first: a new worker holds the machine (and a new credential
    # that soon refuses this one's): claiming the job here would run it under a worker
    # about to be turned away. It is the new worker's.
    hub = RecordingHub()

    def release_machine():
        hub.calls.append("release")
        hub.pending.append(7)

    worker = AutomationWorker(hub, automation(), poll_interval=60, idle_timeout=0.2)
    stats = worker.run(release_machine=release_machine, reclaim_machine=lambda: False)

    assert "claim 7" not in hub.calls
    assert hub.pending == [7] and hub.reports == {}
    assert stats.claimed == 0
