"""GET /api/v1/events reads a page's rows and no others, whichever documented filter it has,
for a tenant's manager and for a platform admin across tenants.

The plans are taken on a trail big and skewed enough for the planner's choice to matter
(20,000 events, one a minute, most of one tenant, some of two others and of the platform;
common and rare types, actors and aggregates), freshly analysed, with nothing priced out.
A page that steps over the rows of other types or actors, or a time range read from the
newest event down, shows up as rows read and thrown away, or as a sort of every match.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from outbox.selectors import event_list
from tests.factories import TenantFactory
from tests.plans import plan_of, rows_read

pytestmark = pytest.mark.django_db

EVENTS = 20_000
PAGE = 51  # the cursor pagination reads one row more than the page
# A time range's id range is widened by ``ID_ORDER_SKEW`` (5 minutes: 5 events here) at
# each end; reading those few rows is the price of it.
SKEW_ROWS = 2 * 5


@pytest.fixture
def history():
    """20,000 events, one a minute up to now: nine in ten of ``tenant``'s, the rest of
    another tenant and of the platform. A type, an actor and an aggregate type of one event
    in 500; one job with a few events."""
    tenant, other = TenantFactory(), TenantFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO events (type, aggregate_type, aggregate_id, tenant_id, actor, payload,
                                correlation_id, occurred_at)
            SELECT CASE WHEN mod(n, 500) = 3 THEN 'TenantRenamed'
                        WHEN mod(n / 3, 2) = 0 THEN 'JobCreated' ELSE 'JobSucceeded' END,
                   CASE WHEN mod(n, 500) = 7 THEN 'Schedule' ELSE 'Job' END,
                   (n / 4)::text,
                   CASE WHEN mod(n, 20) = 1 THEN %(other)s
                        WHEN mod(n, 20) = 2 THEN NULL ELSE %(tenant)s END,
                   CASE WHEN mod(n, 500) = 11 THEN 'user:12'
                        WHEN mod(n, 2) = 0 THEN 'system' ELSE 'worker:' || mod(n, 7) END,
                   '{}'::jsonb, '',
                   now() - (%(events)s - n) * interval '1 minute'
              FROM generate_series(1, %(events)s) AS n
            """,
            {"tenant": tenant.pk, "other": other.pk, "events": EVENTS},
        )
        cursor.execute("ANALYZE events")
        cursor.execute("SELECT min(id), max(id) FROM events")
        low, high = cursor.fetchone()
    return tenant, other, (low + high) // 2


def filters() -> dict[str, dict]:
    now = timezone.now()
    return {
        "no filter": {},
        "a common type": {"types": ["JobCreated"]},
        "a rare type": {"types": ["TenantRenamed"]},
        "the common actor": {"actor": "system"},
        "a rare actor": {"actor": "user:12"},
        "the common aggregate type": {"aggregate_type": "Job"},
        "a rare aggregate type": {"aggregate_type": "Schedule"},
        "one aggregate": {"aggregate_type": "Job", "aggregate_id": "1234"},
        "occurred_after, a day ago": {"occurred_after": now - timedelta(days=1)},
        "occurred_after, 20 minutes ago": {"occurred_after": now - timedelta(minutes=20)},
        "occurred_before, 7 days ago": {"occurred_before": now - timedelta(days=7)},
        "an hour 9 days ago": {
            "occurred_after": now - timedelta(days=9, hours=1),
            "occurred_before": now - timedelta(days=9),
        },
        "a rare type in the last 3 days": {
            "types": ["TenantRenamed"],
            "occurred_after": now - timedelta(days=3),
        },
    }


def scope_of(caller: str, tenant, other) -> dict:
    if caller == "a platform admin":
        return {"caller_tenant_id": None, "platform_admin": True}
    return {
        "caller_tenant_id": (tenant if caller == "the big tenant's manager" else other).pk,
        "platform_admin": False,
    }


# (A small tenant's page may be read along the ids of every tenant, the others skipped:
# its rows are that many times fewer, and as close together in the table, so the planner
# rightly finds it as cheap. What a small tenant must never do is read the indexes of
# every tenant for a filter common to all: the test after this one.)
@pytest.mark.parametrize("caller", ["the big tenant's manager", "a platform admin"])
@pytest.mark.parametrize("page", ["first", "later"])
def test_each_documented_filter_reads_about_a_page_of_rows(history, page, caller):
    """At most three pages' worth of rows read for one page (and the few rows of a time
    range's margin), whatever the filter: an index gives the list's order within it. (A
    filter that keeps a third of the rows or more may be read along the ids, the others
    skipped: that is the three pages.)"""
    tenant, other, middle_id = history
    scope = scope_of(caller, tenant, other)
    problems = []
    for label, selector_filters in filters().items():
        queryset = event_list(**scope, **selector_filters)
        if page == "later":
            # What the cursor adds: the id of the last row of the page before.
            queryset = queryset.filter(id__lt=middle_id)
        indexes, read = rows_read(plan_of(queryset[:PAGE]))
        if read > 3 * PAGE + SKEW_ROWS or not indexes:
            problems.append(f"{label}: {read} rows read through {indexes or 'no index'}")
    assert problems == []


def test_a_small_tenants_page_reads_the_indexes_that_begin_with_the_tenant(history):
    """The filters common across tenants are few rows of a small tenant: its page is read
    from the indexes that hold its rows alone, not those of every tenant."""
    _, other, _ = history
    scope = {"caller_tenant_id": other.pk, "platform_admin": False}

    def indexes(**selector_filters):
        return rows_read(plan_of(event_list(**scope, **selector_filters)[:PAGE]))[0]

    def read_by_tenant(**selector_filters):
        """A common filter, half of the tenant's rows: the tenant's own index of that
        filter, or its index of every event, which passes about two rows for each kept
        (the two cost the planner about the same, and which it picks turns on how the
        indexes lie on disk); never an index of every tenant."""
        indexes, read = rows_read(plan_of(event_list(**scope, **selector_filters)[:PAGE]))
        assert len(indexes) == 1 and next(iter(indexes)).startswith("events_tenant_"), indexes
        assert read <= 3 * PAGE, (indexes, read)
        return indexes

    assert indexes() == {"events_tenant_idx"}
    assert read_by_tenant(types=["JobCreated"]) <= {"events_tenant_type_idx", "events_tenant_idx"}
    assert read_by_tenant(actor="system") <= {"events_tenant_actor_idx", "events_tenant_idx"}
    assert indexes(aggregate_type="Schedule") <= {
        "events_tenant_agg_type_idx",
        "events_agg_type_idx",
    }


def test_a_platform_admins_rare_filter_reads_the_index_of_that_filter(history):
    scope = {"caller_tenant_id": None, "platform_admin": True}

    def indexes(**selector_filters):
        return rows_read(plan_of(event_list(**scope, **selector_filters)[:PAGE]))[0]

    assert indexes(types=["TenantRenamed"]) == {"events_type_idx"}
    assert indexes(actor="user:12") == {"events_actor_idx"}
    assert indexes(aggregate_type="Schedule") == {"events_agg_type_idx"}
    assert indexes(aggregate_type="Job", aggregate_id="1234") == {"events_aggregate_idx"}
