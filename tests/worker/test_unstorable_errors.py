"""A handler's exception whose message holds U+0000 or a lone surrogate (a library quoting
its input, say) is recorded with U+FFFD in their place: in the run's ``last_error``, in
``TaskFailed``'s payload and in the dead letter's context. Neither PostgreSQL (text and
jsonb) nor the brokers' headers take them as they are, and a record that fails leaves the
run unsettled, received again and again."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from outbox.handlers import TaskMessage, task
from outbox.models import Event, TaskRun
from outbox.services import dispatch
from outbox.task_errors import PermanentError
from tests.worker.conftest import RETRY, dead_letters, executions, run_finished, run_of, wait_for
from tests.worker.tasks import record_execution

pytestmark = pytest.mark.django_db(transaction=True)

UNSTORABLE = "cannot read a\x00b\ud800c"
STORED = "cannot read a\ufffdb\ufffdc"


@task("test.unstorable")
def unstorable(message: TaskMessage) -> None:
    record_execution(message)
    if message.payload.get("permanent"):
        raise PermanentError(UNSTORABLE)
    if message.receive_count < message.payload.get("succeed_on", 1):
        raise ValueError(UNSTORABLE)


@pytest.fixture
def unstorable_task(settings, tmp_path):
    catalog = json.loads(settings.TASKS_CATALOG.read_text())
    catalog["tasks"].append({"name": "test.unstorable", "queue": "default", "retry": RETRY})
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(catalog))
    settings.TASKS_CATALOG = path


def dispatch_unstorable(**payload) -> str:
    with transaction.atomic():
        return str(dispatch("test.unstorable", payload))


def test_a_transient_failure_with_unstorable_text_is_retried_and_its_error_kept(
    broker, relay, start_worker, unstorable_task
):
    start_worker()
    run_id = dispatch_unstorable(succeed_on=2)

    wait_for(lambda: run_finished(run_id), what="the run to finish")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 2
    assert run.last_error.startswith(f"ValueError: {STORED} (retry in ")
    assert [count for count, _ in executions(run_id)] == [1, 2]


def test_a_permanent_failure_with_unstorable_text_is_recorded_and_dead_lettered_once(
    broker, relay, start_worker, unstorable_task
):
    start_worker()
    run_id = dispatch_unstorable(permanent=True)

    wait_for(lambda: run_finished(run_id), what="the run to fail")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED
    assert run.receive_count == 1
    assert run.last_error == f"outbox.task_errors.PermanentError: {STORED}"
    event = Event.objects.get(type="TaskFailed", aggregate_type="TaskRun", aggregate_id=run_id)
    assert event.payload["error_message"] == STORED
    (letter,) = wait_for(lambda: dead_letters("default"), what="the dead letter")
    assert letter.run_id == run_id
    assert letter.error["x-error-message"] == STORED
    assert f"PermanentError: {STORED}" in letter.error["x-error-traceback"]
    assert len(executions(run_id)) == 1
