"""manage.py dead_letters: list what is parked, send chosen messages back with their runs."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from outbox.models import TaskRun
from tests.worker.conftest import dead_letters, dispatch_work, run_finished, run_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _park_two(start_worker) -> tuple[str, str]:
    worker = start_worker()
    first, second = dispatch_work(permanent=True), dispatch_work(permanent=True)
    wait_for(lambda: run_finished(first) and run_finished(second), what="both runs to fail")
    wait_for(lambda: len(dead_letters("default")) == 2, what="both dead letters")
    worker.stop()
    return first, second


def test_dead_letters_lists_each_parked_message_with_its_error(broker, relay, start_worker):
    first, second = _park_two(start_worker)
    out = StringIO()

    call_command("dead_letters", "--queue", "default", stdout=out)

    text = out.getvalue()
    assert "-dlq: 2" in text
    assert first in text and second in text
    assert "common.errors.InvalidInput: the payload can never be processed" in text
    # Looking leaves them where they are.
    assert len(dead_letters("default")) == 2


def test_dead_letters_counts_what_waits_not_what_it_listed(broker, relay, start_worker):
    first, second = _park_two(start_worker)
    out = StringIO()

    call_command("dead_letters", "--queue", "default", "--limit", "1", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0].endswith("-dlq: 2 waiting (the first 1 listed)"), lines
    assert len(lines) == 2 and (first in lines[1] or second in lines[1])
    assert len(dead_letters("default")) == 2


def test_dead_letters_sends_a_chosen_message_back_with_its_run_queued(broker, relay, start_worker):
    first, second = _park_two(start_worker)

    call_command("dead_letters", "--queue", "default", "--requeue", first, stdout=StringIO())

    run = run_of(first)
    assert run.status == TaskRun.Status.QUEUED
    assert run.receive_count == 0
    assert run_of(second).status == TaskRun.Status.FAILED
    assert [letter.run_id for letter in dead_letters("default")] == [second]
    # Back in its queue: a worker receives it again (and parks it again, as it is bad input).
    start_worker()
    wait_for(lambda: run_finished(first), what="the requeued run to be received again")
    assert run_of(first).receive_count == 1


def test_dead_letters_requeue_all_empties_the_dead_letter_queue(broker, relay, start_worker):
    first, second = _park_two(start_worker)

    call_command("dead_letters", "--queue", "default", "--requeue-all", stdout=StringIO())

    assert dead_letters("default") == []
    assert {run_of(first).status, run_of(second).status} == {TaskRun.Status.QUEUED}


def test_dead_letters_refuses_an_unknown_queue(broker):
    with pytest.raises(CommandError, match="unknown destination"):
        call_command("dead_letters", "--queue", "nowhere")
