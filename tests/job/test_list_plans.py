"""GET /api/v1/jobs reads a page's rows and no others, whichever documented filter it has.

The plans are taken on a table big and skewed enough for the planner's choice to matter
(20,000 jobs of one tenant, a few of them failed or pending, automations with most, a
twentieth and a hundred of them), freshly analysed, with nothing priced out: what the
planner picks there is what it picks in production. A page that had to step over rows of
the other statuses (the defect this guards against: a status filter on an index without
the status) shows up as rows read and thrown away, or as a sort of every match.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from job.selectors import job_list
from tests.factories import AutomationFactory, TenantFactory, UserFactory
from tests.plans import plan_of, rows_read

pytestmark = pytest.mark.django_db

JOBS = 20_000
PAGE = 51  # the cursor pagination reads one row more than the page


@pytest.fixture
def history():
    """20,000 jobs of one tenant, one every minute, and a few of another tenant."""
    tenant, other = TenantFactory(), TenantFactory()
    user = UserFactory(tenant=tenant)
    common, some, rare = AutomationFactory(), AutomationFactory(), AutomationFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobs (tenant_id, automation_id, requested_by_id, status, params,
                              attempt, claim_token, lease_expires_at, error, failure_reason,
                              output_tail, created_at, updated_at)
            SELECT CASE WHEN mod(n, 50) = 0 THEN %(other)s ELSE %(tenant)s END,
                   CASE WHEN mod(n, 200) = 7 THEN %(rare)s
                        WHEN mod(n, 20) = 9 THEN %(some)s ELSE %(common)s END,
                   %(user)s, s.status, '{}'::jsonb, 1,
                   CASE WHEN s.status = 'running' THEN gen_random_uuid() END,
                   CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END,
                   '', CASE WHEN s.status = 'failed' THEN 'error' ELSE '' END, '',
                   now() - (%(jobs)s - n) * interval '1 minute',
                   now() - (%(jobs)s - n) * interval '1 minute'
              FROM generate_series(1, %(jobs)s) AS n,
                   LATERAL (SELECT CASE WHEN mod(n, 500) = 1 THEN 'pending'
                                        WHEN mod(n, 500) = 2 THEN 'running'
                                        WHEN mod(n, 100) = 3 THEN 'failed'
                                        WHEN mod(n, 100) = 4 THEN 'canceled'
                                        ELSE 'succeeded' END AS status) AS s
            """,
            {
                "tenant": tenant.pk,
                "other": other.pk,
                "user": user.pk,
                "common": common.pk,
                "some": some.pk,
                "rare": rare.pk,
                "jobs": JOBS,
            },
        )
        cursor.execute("ANALYZE jobs")
    return tenant, {"common": common, "a twentieth": some, "a hundred": rare}


def filters(automations: dict) -> dict[str, dict]:
    now = timezone.now()
    return {
        "no filter": {},
        **{f"status={status}": {"statuses": [status]} for status in _statuses()},
        **{
            f"automation with {share} of the jobs": {"automation_id": automation.pk}
            for share, automation in automations.items()
        },
        "created_after": {"created_after": now - timedelta(days=3)},
        "created_before": {"created_before": now - timedelta(days=7)},
    }


def _statuses() -> list[str]:
    return ["pending", "running", "succeeded", "failed", "canceled"]


@pytest.mark.parametrize("page", ["first", "later"])
def test_each_documented_filter_reads_about_a_page_of_rows(history, page):
    """At most two pages' worth of rows read for one page, whatever the filter: the index
    gives the list's order within the filter (or, for the running jobs, holds so few that
    sorting them all is as cheap)."""
    tenant, automations = history
    # A later page: what the cursor adds, the position of the last row of the one before.
    position = timezone.now() - timedelta(days=5)
    problems = []
    for label, selector_filters in filters(automations).items():
        queryset = job_list(tenant=tenant.pk, **selector_filters)
        if page == "later":
            queryset = queryset.filter(created_at__lt=position)
        indexes, read = rows_read(plan_of(queryset[:PAGE]))
        if read > 2 * PAGE or not indexes:
            problems.append(f"{label}: {read} rows read through {indexes or 'no index'}")
    assert problems == []


def test_a_status_page_uses_the_status_index_and_an_automation_page_the_automation_one(
    history,
):
    tenant, automations = history

    failed = plan_of(job_list(tenant=tenant.pk, statuses=["failed"])[:PAGE])
    some = plan_of(job_list(tenant=tenant.pk, automation_id=automations["a twentieth"].pk)[:PAGE])

    # (The most common status or automation may be read from the tenant's index, the few
    # rows of another skipped; the running jobs from their own small index, sorted.)
    assert rows_read(failed)[0] == {"jobs_tenant_status_recent_idx"}
    assert rows_read(some)[0] == {"jobs_tenant_auto_recent_idx"}
