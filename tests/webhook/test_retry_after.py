"""A receiver's Retry-After, in either of its two forms (seconds, or an HTTP date), sets
the next attempt when it asks for longer than the schedule, within the schedule's longest
step; a value that is neither form, or a time already past, leaves the schedule alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from tests.webhook.conftest import Reply, due_deliver_runs, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import transport


def http_date(moment: datetime) -> str:
    return format_datetime(moment.astimezone(UTC), usegmt=True)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("-5", None),
        ("1_000", None),  # Python's float() reads it; HTTP's delay-seconds is digits only
        ("1e3", None),
        ("nan", None),
        ("inf", None),
        ("0x10", None),
        ("soon", None),
        ("", None),
        ("120, 5", None),
        ("9" * 400, float("9" * 400)),  # absurd, but digits: the schedule caps it
    ],
)
def test_the_seconds_form_is_digits_only(value, seconds):
    assert transport._retry_after(value) == seconds


def test_the_date_form_counts_from_now():
    later = timezone.now() + timedelta(seconds=120)
    seconds = transport._retry_after(http_date(later))
    assert seconds is not None
    assert 100 <= seconds <= 121


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Wed, 21 Oct 2015 07:28:00 GMT", id="past"),
        pytest.param("Wed, 32 Oct 2099 07:28:00 GMT", id="no-such-day"),
        pytest.param("Wed, 21 Oct 2099 25:28:00 GMT", id="no-such-hour"),
        pytest.param("Wed, 21 Oct", id="truncated"),
    ],
)
def test_a_date_past_or_unreadable_leaves_the_schedule_alone(value):
    assert transport._retry_after(value) is None


@pytest.mark.django_db
def test_a_503_is_retried_at_the_receivers_retry_after_date(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    # Longer than the schedule's first step (1 s), shorter than its longest (4 s).
    retry_at = timezone.now() + timedelta(seconds=4)
    receiver.script(Reply(status=503, headers={"Retry-After": http_date(retry_at)}))
    complete_a_job(tenant)

    run_due_attempts()

    (retry,) = due_deliver_runs()
    # The date has whole seconds: up to one second sooner than asked for.
    assert retry.available_at - timezone.now() > timedelta(seconds=2)


@pytest.mark.django_db
def test_a_retry_after_date_years_away_is_held_to_the_longest_step(
    receiver, make_endpoint, tenant, settings
):
    make_endpoint(receiver.url)
    receiver.script(Reply(status=429, headers={"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}))
    complete_a_job(tenant)

    run_due_attempts()

    (retry,) = due_deliver_runs()
    longest = timedelta(seconds=max(settings.WEBHOOK_RETRY_DELAYS))
    assert timedelta(seconds=2) < retry.available_at - timezone.now() <= longest
