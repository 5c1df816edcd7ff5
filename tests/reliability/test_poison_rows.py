"""Scenario 5: a poison row of each kind between good rows, on both outbox tables, on
RabbitMQ (a private node with a 64 KiB ``max_message_size``) and on SQS (moto's server).

Kinds: a message too big for the broker (RabbitMQ closes the channel; SQS refuses the
call), a destination that names no queue, a destination whose queue is gone (RabbitMQ
returns the message; SQS answers that the queue does not exist), and on RabbitMQ a queue
at its length limit (the broker nacks). Each poison row backs off alone: the good rows
around it go in the pass that claimed them, never refused, never waiting for a poison
row's next try, once each; and the relay never takes a refusal for an outage.

How long the good rows took is a figure of the scenario, not an assertion: on a shared
machine a stall of a second can fall anywhere, and what the poison rows could cost the good
ones shows in what the relay did to each row (``relay_trail``), in order, without a clock.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass

import pika
import pytest
import redis

from tests.reliability.support import BrokerAudit, Figures, seed, wait_for

# Not a volume test: enough good rows on each side of every poison one.
GOOD_BETWEEN = 5
MAX_MESSAGE_SIZE = 64 * 1024
# What moto's SQS takes (AWS's own limit since 2025); the relay cuts calls at 256 KiB.
SQS_LIMIT = 1024 * 1024

# Every change the relay makes to an outbox row, in the order it made them: the scenario's
# own record, in its own database. ``backed_off``: the change pushed the row into the
# future (a refusal); ``tx``: the relay's transaction (one batch).
TRAIL = (
    """
    CREATE TABLE relay_trail (
        id bigserial PRIMARY KEY,
        run_id uuid NOT NULL,
        sent boolean NOT NULL,
        backed_off boolean NOT NULL,
        tx bigint NOT NULL DEFAULT txid_current()
    )
    """,
    """
    CREATE FUNCTION note_relay_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO relay_trail (run_id, sent, backed_off)
        VALUES (NEW.run_id, NEW.sent_at IS NOT NULL, NEW.available_at > clock_timestamp());
        RETURN NULL;
    END $$
    """,
    *(
        f"CREATE TRIGGER note_relay_change AFTER UPDATE ON {table}"
        " FOR EACH ROW EXECUTE FUNCTION note_relay_change()"
        for table in ("outbox_messages", "platform_outbox_messages")
    ),
)


@dataclass(frozen=True)
class Change:
    """One change the relay made to a row (a line of ``relay_trail``)."""

    sent: bool
    backed_off: bool
    tx: int


def trail(db, run_ids: list[str]) -> dict[str, list[Change]]:
    """What the relay did to each of these rows, in order."""
    changes: dict[str, list[Change]] = {run_id: [] for run_id in run_ids}
    for run_id, sent, backed_off, tx in db.rows(
        "SELECT run_id::text, sent, backed_off, tx FROM relay_trail"
        " WHERE run_id = ANY(%s::uuid[]) ORDER BY id",
        [run_ids],
    ):
        changes[run_id].append(Change(sent, backed_off, tx))
    return changes


def assert_went_alone(
    changes: dict[str, list[Change]], good: list[str], poison: list[str], *, tries: int, wave: str
) -> None:
    """Every good row went as if no poison row were beside it.

    - Sent in the end, and never pushed back: no refusal of a poison row fell on it.
    - Changed at most ``tries`` times: once, sent, by the pass that claimed it; on RabbitMQ
      twice at most, when the broker closed the channel over a too-big message beside it
      (its confirm lost, the row left due, not pushed back, for the next pass).
    - With poison rows in the wave: first changed in a batch that refused one of them for
      the first time. The poison rows did not break their batch (no rollback, no batch
      sent again without them): each was refused in the batch that claimed it, with the
      good rows around it.
    """
    first_refusals = {
        next(change.tx for change in changes[run_id] if change.backed_off)
        for run_id in poison
        if any(change.backed_off for change in changes[run_id])
    }
    for run_id in good:
        history = changes[run_id]
        assert history and history[-1].sent, (wave, run_id, history)
        assert not any(change.backed_off for change in history), (wave, run_id, history)
        assert len(history) <= tries, (wave, run_id, history)
        if poison:
            assert history[0].tx in first_refusals, (wave, run_id, history, first_refusals)


INSERT = """
    INSERT INTO {table} ({tenant_column}run_id, queue, envelope, available_at)
    VALUES ({tenant_value}%(run_id)s::uuid, %(queue)s::text,
            jsonb_build_object(
                'version', 1, 'run_id', %(run_id)s::text, 'task', 'chaos.effect',
                'queue', %(queue)s::text, 'destination', %(destination)s::text, 'event', null,
                'event_id', null, 'tenant', null,
                'payload', jsonb_build_object('padding', %(padding)s::text),
                'occurred_at', clock_timestamp()::text, 'correlation_id', 'poison-test'),
            clock_timestamp())
"""

# Sent? How many attempts? Pushed back into the future?
STATE = """
    SELECT sent_at IS NOT NULL, attempts, available_at > clock_timestamp()
      FROM {table} WHERE run_id = %s
"""


class SqsAudit:
    """What reached an SQS queue, by run id (the same reading as ``BrokerAudit``)."""

    def __init__(self, client, queue_url: str) -> None:
        self.client = client
        self.url = queue_url
        self.copies: dict[str, int] = {}
        self.arrivals: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SqsAudit:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            # A long poll: moto's server runs in this process, and a busy loop of polls
            # would take its interpreter lock from the requests the relay makes.
            messages = self.client.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            now = time.monotonic()
            with self._lock:
                for message in messages:
                    run_id = json.loads(message["Body"])["run_id"]
                    self.copies[run_id] = self.copies.get(run_id, 0) + 1
                    self.arrivals.setdefault(run_id, now)
            if messages:
                self.client.delete_message_batch(
                    QueueUrl=self.url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(messages)
                    ],
                )

    @property
    def seen(self) -> set[str]:
        with self._lock:
            return set(self.copies)

    def duplicates(self) -> int:
        with self._lock:
            return sum(count - 1 for count in self.copies.values())

    def arrival(self, run_id: str) -> float:
        with self._lock:
            return self.arrivals[run_id]


def insert_wave(db, tenant_id: int, rows: list[tuple[str, str, str, int]]) -> list[str]:
    """Rows (table, queue, destination, padding bytes) in one transaction, in order."""
    import psycopg

    run_ids = []
    with psycopg.connect(db.url) as conn, conn.transaction():
        for table, queue, destination, padding in rows:
            run_id = str(uuid.uuid4())
            tenant = table == "outbox_messages"
            conn.execute(
                INSERT.format(
                    table=table,
                    tenant_column="tenant_id, " if tenant else "",
                    tenant_value="%(tenant)s, " if tenant else "",
                ),
                {
                    "run_id": run_id,
                    "queue": queue,
                    "destination": destination,
                    "padding": "x" * padding,
                    "tenant": tenant_id,
                },
            )
            run_ids.append(run_id)
    return run_ids


def policy_in_force(node, queue: str) -> bool:
    """The policy applies to the queue, which holds a message already."""
    listing = node.ctl("list_queues", "name", "policy", "messages", "--no-table-headers").stdout
    return any(
        line.split()[:2] == [queue, "full"] and int(line.split()[2]) >= 1
        for line in listing.splitlines()
        if len(line.split()) == 3
    )


def too_big_refusal_seconds(client, queue_url: str) -> float:
    """How long the SQS endpoint takes to refuse one too-big call (its body sent in full)."""
    from botocore.exceptions import ClientError

    started = time.monotonic()
    with contextlib.suppress(ClientError):
        client.send_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": "0", "MessageBody": "x" * (SQS_LIMIT + 1024)}]
        )
    return time.monotonic() - started


def wake(stack) -> None:
    client = redis.Redis.from_url(stack.env.get("REDIS_URL") or _shared_redis())
    try:
        client.lpush(f"{stack.env['REDIS_KEY_PREFIX']}:outbox:wake", "1")
    finally:
        client.close()


def _shared_redis() -> str:
    from django.conf import settings

    return settings.REDIS_URL


@pytest.fixture(params=["rabbitmq", "sqs"])
def poison_broker(request, private_rabbitmq_factory):
    if request.param == "rabbitmq":
        node = private_rabbitmq_factory(config={"max_message_size": str(MAX_MESSAGE_SIZE)})
        return "rabbitmq", {"RABBITMQ_URL": node.url}, node
    endpoint = request.getfixturevalue("moto_endpoint")
    return "sqs", {"BROKER": "sqs", "SQS_ENDPOINT_URL": endpoint}, endpoint


@pytest.mark.timeout(240)
def test_a_poison_row_backs_off_alone_and_the_good_rows_around_it_go_on(
    poison_broker, scenario_database, make_stack, figures, settings
):
    broker, env, handle = poison_broker
    stack = make_stack(database_url=scenario_database, **env)
    seed(stack)
    db = stack.database
    for statement in TRAIL:
        db.execute(statement)
    tenant_id = db.value("SELECT min(id) FROM tenants")
    # A fast sweep: without its backoff a poison row would be tried every 0.2 s.
    stack.relay(RELAY_SWEEP_INTERVAL="0.2")
    # Up, topology declared.
    stack.wait_for_relay()
    prefix = stack.queue_prefix
    refusal_cost = 0.0
    poisons = {
        "too big": ("default", "default", MAX_MESSAGE_SIZE + 16 * 1024),
        "unknown destination": ("default", "nowhere", 0),
        "queue gone": ("bulk", "bulk", 0),
    }
    if broker == "rabbitmq":
        audit = BrokerAudit(handle.url, lambda: [f"{prefix}default"]).start()
        # The maintenance queue already holds the hourly purge: over a length limit of
        # zero, with reject-publish overflow, the broker nacks every further message.
        handle.ctl(
            "set_policy", "full", f"^{prefix}maintenance$", '{"max-length": 0}',
            "--apply-to", "queues",
        )  # fmt: skip
        wait_for(
            lambda: policy_in_force(handle, f"{prefix}maintenance"),
            timeout=30,
            what="the length limit on the maintenance queue",
        )
        poisons["nacked"] = ("maintenance", "maintenance", 0)
    else:
        from broker.sqs.publisher import sqs_client

        settings.SQS_ENDPOINT_URL = env["SQS_ENDPOINT_URL"]
        client = sqs_client()
        poisons["too big"] = ("default", "default", SQS_LIMIT + 1024)
        client.delete_queue(QueueUrl=client.get_queue_url(QueueName=f"{prefix}bulk")["QueueUrl"])
        url = client.get_queue_url(QueueName=f"{prefix}default")["QueueUrl"]
        refusal_cost = too_big_refusal_seconds(client, url)
        audit = SqsAudit(client, url).start()
    try:
        layout: list[tuple[str, str, str, int]] = []
        kinds: list[tuple[str, str]] = []  # (kind, table) per poison row, in order
        for table in ("outbox_messages", "platform_outbox_messages"):
            layout += [(table, "default", "default", 0)] * GOOD_BETWEEN
            for kind, (queue, destination, padding) in poisons.items():
                layout.append((table, queue, destination, padding))
                kinds.append((kind, table))
                layout += [(table, "default", "default", 0)] * GOOD_BETWEEN
        # What the same number of good rows takes with no poison among them, on this
        # machine now: the figure to read the waves' figures beside.
        clean = insert_wave(db, tenant_id, [(t, "default", "default", 0) for t, *_ in layout])
        committed_clean = time.monotonic()
        wake(stack)
        wait_for(
            lambda: set(clean) <= audit.seen,
            timeout=60,
            what=lambda: f"the clean wave\n{stack.log_tail('relay')}",
            every=0.02,
        )
        clean_wave = max(audit.arrival(r) for r in clean) - committed_clean

        if broker == "rabbitmq":
            # The queue is deleted now, with the relay's connection just used: a connection
            # the relay replaces (one idle past half its heartbeat, after a slow set-up)
            # declares its destinations again, and would bring the queue back.
            connection = pika.BlockingConnection(pika.URLParameters(handle.url))
            connection.channel().queue_delete(f"{prefix}bulk")
            connection.close()
        run_ids = insert_wave(db, tenant_id, layout)
        committed = time.monotonic()
        wake(stack)
        poison_ids = poison_run_ids(run_ids, layout)
        good = [r for r in run_ids if r not in set(poison_ids)]
        wait_for(
            lambda: set(good) <= audit.seen,
            timeout=60,
            what=lambda: f"the good rows\n{stack.log_tail('relay')}",
            every=0.02,
        )
        first_wave = max(audit.arrival(r) for r in good) - committed

        # The poison rows keep backing off while new good rows go straight through.
        time.sleep(1.5)
        second = insert_wave(db, tenant_id, [(t, "default", "default", 0) for t, *_ in layout[:40]])
        committed_again = time.monotonic()
        wake(stack)
        wait_for(
            lambda: set(second) <= audit.seen,
            timeout=60,
            what=lambda: f"the second wave\n{stack.log_tail('relay')}",
            every=0.02,
        )
        second_wave = max(audit.arrival(r) for r in second) - committed_again
        time.sleep(2)
        states = {
            run_id: db.rows(STATE.format(table=table), [run_id])[0]
            for run_id, (_kind, table) in zip(poison_ids, kinds, strict=True)
        }
        changes = trail(db, run_ids + second)
        log = (stack.logs / "relay.log").read_text(errors="replace")
        # A connection the relay opened meanwhile (one lost, or idle past half its
        # heartbeat on a loaded machine) declares its destinations again: the queue is back,
        # and the row whose queue was gone rightly goes to it.
        queue_back = broker == "rabbitmq" and f"{prefix}bulk" in (
            handle.ctl("list_queues", "name", "--no-table-headers").stdout.split()
        )
    finally:
        audit.stop()
        stack.close()

    all_good = set(clean) | set(good) | set(second)
    figures(
        Figures(
            f"5 poison rows ({broker})",
            sent=len(all_good),
            delivered=len(all_good & audit.seen),
            duplicates=audit.duplicates(),
            lost=len(all_good - audit.seen),
            recovery_seconds=max(first_wave, second_wave),
            extra={
                "poison_rows": len(states),
                "poison_attempts": ",".join(str(s[1]) for s in states.values()),
                "good_first_wave_s": first_wave,
                "good_second_wave_s": second_wave,
                "clean_wave_s": clean_wave,
                "too_big_refusal_s": refusal_cost,
                "deleted_queue_declared_again": queue_back,
            },
        )
    )
    # A message too big for RabbitMQ closes the channel: the confirms of the messages
    # published just before it on that channel die with it, and those rows go again once
    # (at least once delivery; consumers dedupe by run id). Nothing else is sent twice.
    assert audit.duplicates() <= (GOOD_BETWEEN * 2 if broker == "rabbitmq" else 0)
    assert all(count <= 2 for count in audit.copies.values())
    tries = 2 if broker == "rabbitmq" else 1
    assert_went_alone(changes, good, poison_ids, tries=tries, wave="first")
    assert_went_alone(changes, second, [], tries=tries, wave="second")
    for (kind, table), (sent, attempts, backed_off) in zip(kinds, states.values(), strict=True):
        if kind == "queue gone" and queue_back:
            continue
        assert not sent, f"{kind} in {table} was sent\n{log[-3000:]}"
        # Refused and pushed back: a few tries in these seconds (1 s doubling), not one
        # per sweep.
        assert 1 <= attempts <= 4, (kind, table, attempts, backed_off)
    assert "broker unreachable" not in log, "a refusal of one message was taken for an outage"


def poison_run_ids(run_ids: list[str], layout) -> list[str]:
    """The poison rows' run ids, in the order they were laid out."""
    return [
        run_id
        for run_id, (_table, _queue, destination, padding) in zip(run_ids, layout, strict=True)
        if destination != "default" or padding
    ]
