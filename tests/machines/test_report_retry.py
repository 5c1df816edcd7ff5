"""An automation worker whose report meets a hub briefly unavailable (a database restart
behind it answers 503; a restarting hub refuses connections) reports again, instead of
dropping the outcome of a job that ran and leaving it to be run a second time."""

from __future__ import annotations

from automation.agent.client import HubError
from automation.agent.worker import AutomationWorker
from tests.machines.test_idle_exit import RecordingHub, automation


class FlakyHub(RecordingHub):
    """Answers the first reports with the given failures, then takes the report."""

    def __init__(self, *failures: HubError) -> None:
        super().__init__()
        self.failures = list(failures)
        self.attempts = 0

    def complete(self, job_id, token, **report) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        super().complete(job_id, token, **report)


def run_one_job(hub: FlakyHub):
    hub.pending.append(7)
    worker = AutomationWorker(hub, automation(), poll_interval=60, idle_timeout=0.2)
    return worker.run(release_machine=lambda: None)


def test_a_report_the_hub_could_not_take_for_a_moment_is_sent_again():
    hub = FlakyHub(
        HubError("POST /jobs/7/complete: 503 unavailable", status=503, code="unavailable"),
        HubError("POST /jobs/7/complete: hub unreachable"),
    )

    stats = run_one_job(hub)

    assert hub.reports == {7: "complete"}
    assert hub.attempts == 3
    assert stats.succeeded == 1 and not stats.errors


def test_a_report_the_hub_refuses_is_not_sent_again():
    # A 409: the job is no longer this worker's (settled, or claimed again): final.
    hub = FlakyHub(HubError("POST /jobs/7/complete: 409 not_running", status=409))

    stats = run_one_job(hub)

    assert hub.attempts == 1
    assert hub.reports == {}
    assert stats.succeeded == 0 and len(stats.errors) == 1
