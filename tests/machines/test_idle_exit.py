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
