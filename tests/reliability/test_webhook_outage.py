"""Scenario 9: a tenant's webhook receiver down (its port closed) under steady events, then
back.

Two tenants create jobs through the API at a steady rate; each has an endpoint that wants
``JobCreated``, on a receiver of its own on loopback. Tenant A's receiver closes its port
for the outage (connection refused) and opens it again. Asserted: nothing lost (every
delivery reached its receiver); A's backlog (every delivery made before its return) drained
within 10 s of the return; tenant B's latency during the outage as before it (p50, max).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.reliability.support import (
    ROOT,
    Figures,
    JobTraffic,
    Seeded,
    Stack,
    free_port,
    scaled,
    seed,
    wait_for,
)

OUTAGE = scaled(15.0, 60.0)
BEFORE, AFTER = 10.0, 15.0
RATE = 4.0  # jobs per second and tenant
DRAIN_BOUND = 10.0


class Receiver:
    """A webhook receiver on a fixed port: answers 200 and notes each webhook-id's arrival;
    ``close()`` closes the port (connection refused), ``open()`` listens again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrivals: list[tuple[str, float]] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def open(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.arrivals.append((self.headers["webhook-id"], time.time()))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def first_arrivals(self) -> dict[str, float]:
        with self.lock:
            first: dict[str, float] = {}
            for webhook_id, at in self.arrivals:
                first.setdefault(webhook_id, at)
            return first

    def duplicates(self) -> int:
        with self.lock:
            return len(self.arrivals) - len({webhook_id for webhook_id, _ in self.arrivals})


# A tenant with an endpoint on ``url`` (the first: seed's own tenant; another: a new one,
# with a person whose token creates jobs of the same automation), through the services.
_TENANT = """
import json, sys, uuid
import django
django.setup()
from identity.tokens import issue_access_token
from tests.factories import TenantFactory, UserFactory
from webhook.services import endpoint_create
tenant_id, url = sys.argv[1], sys.argv[2]
token = None
if tenant_id == "new":
    tag = uuid.uuid4().hex[:8]
    tenant = TenantFactory(name=f"Tenant {tag}", slug=f"tenant-{tag}")
    token = issue_access_token(UserFactory(tenant=tenant, email=f"b-{tag}@example.com")).token
    tenant_id = tenant.pk
endpoint = endpoint_create(tenant=int(tenant_id), url=url, event_types=["JobCreated"], actor=None)
print(json.dumps({"endpoint_id": endpoint.pk, "token": token}))
"""


def tenant_with_endpoint(stack: Stack, url: str, seeded: Seeded | None = None):
    """``seeded``: another tenant than seed's, creating jobs of ``seeded``'s automation."""
    if seeded is None:
        made = seed(stack)
        # The person seed just made is its tenant's.
        tenant_id = str(
            stack.database.value(
                "SELECT tenant_id FROM users WHERE tenant_id IS NOT NULL ORDER BY id DESC LIMIT 1"
            )
        )
    else:
        made, tenant_id = seeded, "new"
    result = subprocess.run(
        [sys.executable, "-c", _TENANT, tenant_id, url],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    if answer["token"]:
        made = dataclasses.replace(made, token=answer["token"])
    return made, answer["endpoint_id"]


def deliveries(stack: Stack, endpoint_id: int) -> list[tuple[str, float, str]]:
    """(webhook-id, created at as epoch seconds, status) of the endpoint's deliveries."""
    return stack.database.rows(
        "SELECT message_id, extract(epoch FROM created_at)::float8, status "
        "FROM webhook_deliveries WHERE endpoint_id = %s ORDER BY id",
        [endpoint_id],
    )


def latencies(rows, arrivals: dict[str, float], since: float, until: float) -> list[float]:
    return [
        arrivals[webhook_id] - created
        for webhook_id, created, _ in rows
        if since <= created < until and webhook_id in arrivals
    ]


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


@pytest.mark.timeout(scaled(300, 600))
def test_a_receivers_outage_loses_nothing_and_its_backlog_comes_back_within_seconds(
    scenario_database, make_stack, figures
):
    stack = make_stack(database_url=scenario_database, WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true")
    down, healthy = Receiver(), Receiver()
    down.open()
    healthy.open()
    seeded_a, endpoint_a = tenant_with_endpoint(stack, down.url)
    seeded_b, endpoint_b = tenant_with_endpoint(stack, healthy.url, seeded_a)
    stack.api(workers=3)
    stack.relay()
    # The webhook's queue only: the power-on messages of the jobs wait on theirs, unread.
    stack.worker(QUEUES="default")
    total = int(RATE * (BEFORE + OUTAGE + AFTER))
    traffic = [
        JobTraffic(stack.api_url, seeded, threads=2, total=total, rate=RATE).start()
        for seeded in (seeded_a, seeded_b)
    ]
    try:
        time.sleep(BEFORE)
        went_down = time.time()
        down.close()
        time.sleep(OUTAGE)
        came_back = time.time()
        down.open()
        for each in traffic:
            each.join(timeout=scaled(240, 480))
        rows_a, rows_b = deliveries(stack, endpoint_a), deliveries(stack, endpoint_b)
        wait_for(
            lambda: (
                set(down.first_arrivals()) >= {row[0] for row in rows_a}
                and set(healthy.first_arrivals()) >= {row[0] for row in rows_b}
            ),
            timeout=120,
            what=lambda: f"every delivery at its receiver\n{stack.log_tail('worker', chars=2000)}",
        )
    finally:
        down.close()
        healthy.close()
        stack.close()

    for each in traffic:
        assert each.statuses == {201: total}, each.failures[:5]
    arrivals_a, arrivals_b = down.first_arrivals(), healthy.first_arrivals()
    sent = len(rows_a) + len(rows_b)
    delivered = len({r[0] for r in rows_a} & set(arrivals_a)) + len(
        {r[0] for r in rows_b} & set(arrivals_b)
    )
    backlog = [row for row in rows_a if row[1] < came_back]
    drained_in = max(arrivals_a[row[0]] for row in backlog) - came_back
    held_during = [row for row in rows_a if went_down <= row[1] < came_back]
    after_a = latencies(rows_a, arrivals_a, came_back, float("inf"))
    before_b = latencies(rows_b, arrivals_b, 0, went_down)
    during_b = latencies(rows_b, arrivals_b, went_down, came_back + DRAIN_BOUND)
    figures(
        Figures(
            "9 webhook receiver outage",
            sent=sent,
            delivered=delivered,
            duplicates=down.duplicates() + healthy.duplicates(),
            lost=sent - delivered,
            recovery_seconds=drained_in,
            extra={
                "outage_s": OUTAGE,
                "backlog": len(held_during),
                "a_after_return_p50_s": p50(after_a),
                "a_after_return_max_s": max(after_a, default=0.0),
                "b_before_p50_s": p50(before_b),
                "b_before_max_s": max(before_b, default=0.0),
                "b_during_p50_s": p50(during_b),
                "b_during_max_s": max(during_b, default=0.0),
            },
        )
    )
    assert sent == 2 * total  # one delivery per JobCreated and endpoint
    assert delivered == sent
    assert {row[2] for row in rows_a + rows_b} <= {"delivered", "pending"}
    assert drained_in < DRAIN_BOUND
    # The other tenant did not wait for this one's outage.
    assert p50(during_b) <= p50(before_b) + 0.5
    assert max(during_b) <= max(before_b) + 2.0
