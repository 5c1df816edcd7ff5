"""A claim the hub made whose answer never reached the worker: the worker sends the same
claim again and runs the job, instead of leaving it running under a lease nobody holds.

The hub is the live server, reached through a port the test cuts (``Forwarder``) right
after the hub committed the claim, before its answer goes back.
"""

from __future__ import annotations

import sys
import threading

import pytest

from automation.agent.spool import OutcomeSpool
from job.api import workers as worker_views
from job.models import Job
from tests.factories import AutomationFactory, JobFactory, WorkerFactory
from tests.job.support import events_of
from tests.machines.test_outcome_survives import hub, running  # noqa: F401 (a fixture)
from tests.polling import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_whose_answer_was_lost_is_sent_again_and_the_job_runs_once(
    hub,  # noqa: F811 (the fixture imported above)
    tmp_path,
    monkeypatch,
    caplog,
):
    automation = AutomationFactory(command=[sys.executable, "-c", "print('ran')"])
    credential = WorkerFactory(automation=automation).credential
    job = JobFactory(automation=automation)
    claims = []
    claim = worker_views.job_claim

    def answer_lost_the_first_time(**kwargs):
        claimed = claim(**kwargs)
        claims.append(claimed.claim_token)
        if len(claims) == 1:
            # Committed; the connection carrying the answer is cut, and the port opens
            # again a moment later.
            hub.close()
            threading.Timer(0.5, hub.open).start()
        return claimed

    monkeypatch.setattr(worker_views, "job_claim", answer_lost_the_first_time)

    spool = OutcomeSpool(tmp_path / "outcomes")
    with running(hub, automation, credential, spool, poll_interval=0.2):
        wait_until(
            lambda: Job.objects.get(pk=job.pk).status == "succeeded",
            timeout=20,
            message="the job to run after its claim's answer was lost",
        )

    job = Job.objects.get(pk=job.pk)
    assert job.attempt == 1
    assert "ran" in job.output_tail
    # The same claim both times, started once.
    assert len(claims) == 2 and claims[0] == claims[1] == job.claim_token
    assert events_of(job.pk) == ["JobStarted", "JobCompleted"]
    assert any("could not claim it yet" in r.getMessage() for r in caplog.records)
