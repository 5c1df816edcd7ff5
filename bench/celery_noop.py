"""The Celery side of bench/worker.py: a no-op task on a quorum queue of the same broker.

Started by the benchmark as ``celery -A bench.celery_noop worker ...`` with its settings in
the environment (``BENCH_CELERY_*``). Celery as users would run it for tasks that must not
be lost: ``acks_late`` (acked after the task returns), prefetch 1 per process or thread
(4 for 4 slots), no result backend.

The clock: the first task to start records the time, the task that completes the last
message records the time; both in a file the benchmark reads (rewritten every hundred
tasks with how many are done). The counter lives in shared
memory created before the prefork pool forks, so the pool's processes count together.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from celery import Celery
from kombu import Exchange, Queue

QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench-celery")
EXPECTED = int(os.environ.get("BENCH_CELERY_MESSAGES", "0"))
CLOCK_FILE = Path(os.environ.get("BENCH_CELERY_CLOCK", "/dev/null"))

app = Celery("bench", broker=os.environ.get("BENCH_CELERY_BROKER", "amqp://localhost//"))
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=QUEUE,
    task_queues=[
        Queue(
            QUEUE,
            Exchange(QUEUE, type="direct"),
            routing_key=QUEUE,
            queue_arguments={"x-queue-type": "quorum"},
            durable=True,
        )
    ],
    worker_hijack_root_logger=False,
    worker_send_task_events=False,
    worker_enable_remote_control=False,
    broker_connection_retry_on_startup=True,
)

_done = multiprocessing.Value("l", 0)
_first = multiprocessing.Value("d", 0.0)


@app.task(name="bench.noop")
def noop(number: int) -> None:
    with _done.get_lock():
        if _first.value == 0.0:
            _first.value = time.time()
        _done.value += 1
        done = _done.value
    if done == EXPECTED or done % 100 == 0:
        # "first last done": progress too, so that a stalled run can be told apart.
        temporary = CLOCK_FILE.with_suffix(".tmp")
        temporary.write_text(f"{_first.value} {time.time()} {done}\n")
        temporary.replace(CLOCK_FILE)
