"""Re-arming a message's own outbox row: the relay sends it again once it is due.

How a message comes back where the broker cannot delay one (RabbitMQ): a transient
failure's retry (``RunLedger.retrying``, in the transaction that marks the run
``retrying``) and a copy turned away because another worker holds its run
(``worker.come_back``). A delay of any length becomes ``available_at``; the relay only
sends what is due (docs/worker.md, "Why the outbox is RabbitMQ's delay mechanism").
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from outbox.models import OutboxMessage, PlatformOutboxMessage

# Re-arms a message's own outbox row: the relay sends it again once it is due. The row
# may have been purged already (sent more than 7 days ago): then it is written again.
_REARM = """
    INSERT INTO {table} ({tenant_column}run_id, queue, envelope, available_at)
    VALUES ({tenant_value}%(run_id)s, %(queue)s, %(envelope)s::jsonb,
            clock_timestamp() + %(delay)s * interval '1 second')
    ON CONFLICT (run_id) DO UPDATE
       SET sent_at = NULL, available_at = {available_at}
"""
# A retry is due after its own backoff, whatever was planned before.
_DUE_AT_DELAY = "EXCLUDED.available_at"
# A copy given back while another worker holds the run must not push back a send that
# is already planned sooner (the holder's retry, say).
_DUE_AT_THE_EARLIER = """CASE WHEN {table}.sent_at IS NULL
                THEN least({table}.available_at, EXCLUDED.available_at)
                ELSE EXCLUDED.available_at END"""


def rearm_outbox_row(envelope: dict[str, Any], *, delay: float, keep_earlier: bool = False) -> None:
    """Have the relay send the message again after ``delay`` seconds (or sooner, with
    ``keep_earlier``, if a send is already planned sooner)."""
    tenant_id = envelope.get("tenant")
    model = OutboxMessage if tenant_id is not None else PlatformOutboxMessage
    tenant = tenant_id is not None
    table = model._meta.db_table
    sql = _REARM.format(
        table=table,
        tenant_column="tenant_id, " if tenant else "",
        tenant_value="%(tenant)s, " if tenant else "",
        available_at=(_DUE_AT_THE_EARLIER if keep_earlier else _DUE_AT_DELAY).format(table=table),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                "tenant": tenant_id,
                "run_id": str(envelope["run_id"]),
                "queue": envelope.get("queue", "default"),
                "envelope": json.dumps(envelope),
                "delay": max(0.0, float(delay)),
            },
        )
