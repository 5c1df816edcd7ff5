"""The runtime's small parts: handler registry, failure classes, backoff."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from broker.consume import BadMessage, Delivery
from common.errors import Conflict, Forbidden, InvalidInput, NotFound
from outbox.catalog import RetryPolicy
from outbox.handlers import get_handler, task
from outbox.task_errors import PermanentError, is_permanent
from worker.retries import backoff_with_jitter


@pytest.mark.parametrize("error", [PermanentError, InvalidInput, NotFound, Forbidden, BadMessage])
def test_refusals_no_retry_can_fix_are_permanent(error):
    assert is_permanent(error("no"))


@pytest.mark.parametrize("error", [RuntimeError, TimeoutError, ConnectionError, Conflict])
def test_everything_else_is_transient(error):
    assert not is_permanent(error("maybe later"))


def test_a_task_name_cannot_have_two_handlers():
    @task("test.registry.once")
    def first(message):
        pass

    with pytest.raises(ImproperlyConfigured, match="two handlers"):

        @task("test.registry.once")
        def second(message):
            pass

    assert get_handler("test.registry.once") is first


def test_backoff_grows_exponentially_with_jitter_within_half_to_all_of_each_step():
    policy = RetryPolicy(max_receives=5, backoff_seconds=2, backoff_max_seconds=600)
    for receive, step in [(1, 2), (2, 4), (3, 8), (4, 16)]:
        delays = [backoff_with_jitter(policy, receive) for _ in range(200)]
        assert all(step / 2 <= delay <= step for delay in delays)
        assert len({round(delay, 6) for delay in delays}) > 100


def test_backoff_is_capped():
    policy = RetryPolicy(max_receives=5, backoff_seconds=2, backoff_max_seconds=10)
    assert all(backoff_with_jitter(policy, 30) <= 10 for _ in range(50))


def test_a_delivery_is_settled_by_exactly_one_caller():
    delivery = Delivery(destination="default", body=b"{}", receipt=1)
    with delivery.settling() as first:
        pass
    with delivery.settling() as second:
        pass
    assert (first, second) == (True, False)


def test_a_body_that_is_not_a_json_object_is_a_bad_message():
    with pytest.raises(BadMessage):
        _ = Delivery(destination="default", body=b"[1, 2]", receipt=1).envelope
