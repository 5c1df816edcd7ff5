"""What the automation worker retries, and how long it pauses between attempts."""

from __future__ import annotations

import pytest

from automation.agent.client import HubError
from lifecycle import Backoff


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        *((status, True) for status in (None, 500, 502, 503, 429)),
        *((status, False) for status in (400, 401, 404, 409, 413)),
    ],
)
def test_only_an_absent_failing_or_busy_hub_is_worth_asking_again(status, retryable):
    assert HubError("x", status=status).retryable is retryable


def test_a_401_means_the_credential_was_refused():
    assert HubError("x", status=401).credential_refused
    assert not HubError("x", status=403).credential_refused


def test_pauses_double_up_to_the_cap_each_drawn_from_its_upper_half():
    backoff = Backoff(0.5, 4.0, jitter=True)
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    pauses = [backoff.failed() for _ in ceilings]
    assert all(c / 2 <= p <= c for p, c in zip(pauses, ceilings, strict=True))
    backoff.reset()
    assert backoff.failed() <= 0.5
