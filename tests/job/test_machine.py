"""The jobs as a state machine, driven by Hypothesis over the real database.

Random sequences of what a worker machine does, right or wrong: claims (new, sent again
with their token, with a token of an earlier attempt), heartbeats, output, success and
failure reports (repeated, out of order, under a stale claim, for a job never claimed);
what people do (cancel); and what the hub does on its own: the clock moving on, the
monitor settling expired leases, an outage's fresh leases, a deactivated tenant's jobs
canceled.

After every step: every job that is not finished has a way forward (a pending one waits
for a claim, or is its deactivated tenant's and the check, or a claim, cancels it; a running
one holds a claim and a lease no longer than JOB_LEASE_SECONDS from now, nor than two leases
after a cancellation asked of it, which the monitor settles once it runs out); a finished
job stays as it ended; each attempt recorded JobStarted once and each end its one event; a
refused call changed nothing (but a claim that cancels a deactivated tenant's job); a job's
output is its chunks end to end, numbered from 0 within each attempt.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
import time_machine
from django.conf import settings
from django.db import transaction
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from common.errors import DomainError
from identity.models import Tenant
from job.management.commands.watch_stuck_jobs import Command
from job.models import FINISHED, Job, JobOutputChunk, JobStatus
from job.monitor import jobs_renew_leases_after_outage, monitor_cycle_ended
from job.services import (
    _STATE_FIELDS,
    DEACTIVATED_TENANT,
    job_cancel,
    job_claim,
    job_complete,
    job_fail,
    job_heartbeat,
    job_output_append,
    jobs_cancel_deactivated,
)
from outbox.models import Event
from tests.factories import AutomationFactory, JobFactory, TenantFactory, UserFactory, WorkerFactory

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LEASE = 60
ENDS = {"JobCompleted", "JobFailed", "JobCanceled"}


def state_of(job: Job) -> dict:
    return {name: getattr(job, name) for name in _STATE_FIELDS}


class Jobs(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        # Each example in a savepoint of the test's transaction, rolled back at its end.
        self._example = transaction.atomic()
        self._example.__enter__()
        try:
            self.tenant = TenantFactory()
            self.person = UserFactory(tenant=self.tenant)
            automation = AutomationFactory(max_concurrency=2, max_attempts=2)
            self.worker = WorkerFactory(automation=automation)
        except BaseException:
            self._example.__exit__(*sys.exc_info())
            raise
        self.now = START
        # Every claim token a worker was answered with, per job: the machine may send any
        # of them again, late.
        self.tokens: dict[int, list[uuid.UUID]] = {}
        # How each finished job ended: it must stay so.
        self.ended: dict[int, dict] = {}
        # When the monitor last gave every running job a fresh lease (after an outage).
        self.renewed_at = START

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._example.__exit__(None, None, None)

    def clock(self):
        return time_machine.travel(self.now, tick=False)

    def job(self, job_id: int) -> Job:
        return Job.objects.get(pk=job_id)

    def token(self, job_id: int, pick: int) -> uuid.UUID:
        """One of the job's tokens (its current one, or an earlier), or one never issued."""
        known = self.tokens.get(job_id, [])
        return known[pick % len(known)] if known and pick >= 0 else uuid.uuid4()

    def refused_or_done(self, job_id: int, call) -> None:
        """Make the call; if the hub refuses it, the job must be as it was."""
        before = state_of(self.job(job_id))
        try:
            with self.clock():
                call()
        except DomainError:
            after = self.job(job_id)
            if not self.tenant.is_active and before["status"] == JobStatus.PENDING:
                # A refused claim of a deactivated tenant's job cancels it, as the
                # deactivation's task would have.
                assert state_of(after) == before or (
                    after.status == JobStatus.CANCELED and after.error == DEACTIVATED_TENANT
                ), after
            else:
                assert state_of(after) == before, "a refused call changed the job"

    # --- people ------------------------------------------------------------------------

    @rule(target=jobs)
    def create(self):
        with self.clock():
            job = JobFactory(
                tenant=self.tenant, automation=self.worker.automation, requested_by=self.person
            )
        return job.pk

    @rule(job_id=jobs)
    def cancel(self, job_id):
        self.refused_or_done(
            job_id, lambda: job_cancel(tenant=self.tenant, job_id=job_id, actor=self.person)
        )

    # --- the worker machine ------------------------------------------------------------

    @rule(job_id=jobs, pick=st.integers(-1, 3))
    def claim(self, job_id, pick):
        token = self.token(job_id, pick)

        def call():
            job = job_claim(worker=self.worker, job_id=job_id, claim_token=token)
            self.tokens.setdefault(job_id, []).append(job.claim_token)

        self.refused_or_done(job_id, call)

    @rule(job_id=jobs, pick=st.integers(-1, 3), progress=st.sampled_from([None, 0.5]))
    def heartbeat(self, job_id, pick, progress):
        token = self.token(job_id, pick)
        self.refused_or_done(
            job_id,
            lambda: job_heartbeat(
                worker=self.worker, job_id=job_id, claim_token=token, progress=progress
            ),
        )

    @rule(job_id=jobs, pick=st.integers(-1, 3), seq=st.integers(0, 3))
    def output(self, job_id, pick, seq):
        token = self.token(job_id, pick)
        self.refused_or_done(
            job_id,
            lambda: job_output_append(
                worker=self.worker, job_id=job_id, claim_token=token, seq=seq, text=f"[{seq}]"
            ),
        )

    @rule(job_id=jobs, pick=st.integers(-1, 3), exit_code=st.sampled_from([None, 0]))
    def complete(self, job_id, pick, exit_code):
        token = self.token(job_id, pick)
        self.refused_or_done(
            job_id,
            lambda: job_complete(
                worker=self.worker,
                job_id=job_id,
                claim_token=token,
                result={"ok": True},
                exit_code=exit_code,
            ),
        )

    @rule(
        job_id=jobs,
        pick=st.integers(-1, 3),
        exit_code=st.sampled_from([None, 1]),
        reason=st.sampled_from([None, "timeout"]),
    )
    def fail(self, job_id, pick, exit_code, reason):
        token = self.token(job_id, pick)
        self.refused_or_done(
            job_id,
            lambda: job_fail(
                worker=self.worker,
                job_id=job_id,
                claim_token=token,
                error="boom",
                exit_code=exit_code,
                reason=reason,
            ),
        )

    # --- the hub -----------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 20, LEASE, 3 * LEASE]))
    def time_passes(self, seconds):
        self.now += timedelta(seconds=seconds)

    @rule()
    def monitor_settles_lost_jobs(self):
        with self.clock():
            Command().settle_lost_jobs()
            # What it settled is settled: no running job is left with its lease run out.
            assert not Job.objects.filter(
                tenant=self.tenant, status=JobStatus.RUNNING, lease_expires_at__lte=self.now
            ).exists()

    @rule(gap=st.sampled_from([10, 3600]))
    def monitor_after_a_gap(self, gap):
        with time_machine.travel(self.now - timedelta(seconds=gap), tick=False):
            monitor_cycle_ended()
        with self.clock():
            if jobs_renew_leases_after_outage(interval=30, margin=30):
                self.renewed_at = self.now

    @precondition(lambda self: self.tenant.is_active)
    @rule()
    def tenant_deactivated(self):
        with self.clock():
            Tenant.objects.filter(pk=self.tenant.pk).update(
                is_active=False, deactivated_at=self.now
            )
            self.tenant.refresh_from_db()
            jobs_cancel_deactivated(tenant_id=self.tenant.pk)

    # --- after every step ----------------------------------------------------------------

    @invariant()
    def every_unfinished_job_has_a_way_forward(self):
        lease_bound = self.now + timedelta(seconds=settings.JOB_LEASE_SECONDS)
        for job in Job.objects.filter(tenant=self.tenant):
            if job.status == JobStatus.PENDING:
                assert job.claim_token is None and job.lease_expires_at is None, job
                # A deactivated tenant's pending job is the stranded check's to cancel.
                assert self.tenant.is_active or job.created_at >= self.tenant.deactivated_at
            elif job.status == JobStatus.RUNNING:
                assert job.claim_token is not None and job.started_at is not None, job
                assert job.lease_expires_at is not None, job
                assert job.lease_expires_at <= lease_bound, (job, job.lease_expires_at)
                if job.cancel_requested:
                    # Heartbeats cannot hold a job someone asked to cancel for ever.
                    lease = timedelta(seconds=settings.JOB_LEASE_SECONDS)
                    assert job.lease_expires_at <= max(
                        job.cancel_requested_at + 2 * lease, self.renewed_at + lease
                    ), job
            else:
                assert job.status in FINISHED
                assert job.finished_at is not None and job.lease_expires_at is None, job

    @invariant()
    def a_finished_job_stays_as_it_ended(self):
        for job in Job.objects.filter(tenant=self.tenant, status__in=FINISHED):
            ended = {name: value for name, value in state_of(job).items()}
            assert self.ended.setdefault(job.pk, ended) == ended, job

    @invariant()
    def each_attempt_and_end_is_recorded_once(self):
        for job in Job.objects.filter(tenant=self.tenant):
            events = Counter(
                Event.objects.filter(aggregate_type="Job", aggregate_id=str(job.pk)).values_list(
                    "type", flat=True
                )
            )
            assert events["JobStarted"] == job.attempt, (job, events)
            ends = sum(events[name] for name in ENDS)
            assert ends == (1 if job.is_finished else 0), (job, events)

    @invariant()
    def the_output_is_its_chunks_end_to_end(self):
        for job_id in self.tokens:
            chunks = list(JobOutputChunk.objects.filter(job_id=job_id).order_by("offset"))
            for before, after in pairwise(chunks):
                assert after.offset == before.end
            by_attempt: dict[int, list[int]] = {}
            for chunk in chunks:
                by_attempt.setdefault(chunk.attempt, []).append(chunk.seq)
            for seqs in by_attempt.values():
                assert seqs == list(range(len(seqs))), by_attempt


@pytest.mark.django_db
def test_jobs_keep_a_way_forward_whatever_their_machine_sends(settings):
    settings.JOB_LEASE_SECONDS = LEASE
    run_state_machine_as_test(
        Jobs,
        settings=hypothesis_settings(
            parent=hypothesis_settings.default, max_examples=80, stateful_step_count=30
        ),
    )
