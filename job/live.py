"""Following a job's output live: Server-Sent Events from its stored log.

A follower is told of new output by Redis and reads it from the database, where the
worker's chunks are stored (``job_output_append``): the log is the truth, Redis only makes
the follower read sooner.

- **Wakes.** After a chunk is stored, and after the job finishes, its id is published on
  ``JOB_OUTPUT_CHANNEL`` (``announce_output``, after the commit). Each stream process
  subscribes once (``OutputWakes``) and wakes the followers of that job. Without Redis,
  a follower still reads every ``JOB_OUTPUT_FOLLOW_POLL_SECONDS``.
- **Events.** ``output`` events carry the text after the offset the client has, as JSON
  (``{"offset", "next_offset", "text"}``, plus ``dropped`` when characters before were
  deleted); each event's id is its ``next_offset``, so a client that reconnects sends it
  back as ``Last-Event-ID`` and gets each character once. ``end`` says the job finished
  and its log was sent to its end.
- **Bounds.** A stream process holds at most ``JOB_OUTPUT_FOLLOW_MAX_STREAMS`` streams,
  ``JOB_OUTPUT_FOLLOW_MAX_PER_TENANT`` of them for one tenant (``StreamSlots``); past them
  a follower is told to come back later (429). A stream lasts no longer than the access
  token it was opened with, and ends once its reader may no longer log in (checked every
  ``JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS``): what a new request of theirs would be refused.
  A database that does not answer holds none of these back: a read is waited on for a
  keep-alive at most, then again, while the stream keeps talking and ends on time.
- **Where.** ``follow`` holds a stream open and is served by the ASGI entry point
  (``hubdommed.asgi``): each follower costs a coroutine and no worker. The WSGI server
  answers the same request with ``events_now``: what is there now, and ``retry`` for
  when to ask again, so a follower there costs one short request a second, never a
  worker for the job's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection

from identity.selectors import user_may_log_in
from job.models import Job
from job.selectors import OutputPage, job_output_page
from outbox.wake import announce_on_commit

logger = logging.getLogger("hubdommed.job")

# The most characters one event carries: a follower far behind catches up in events this size.
EVENT_MAX_CHARS = 64 * 1024
# Reads of the log from the stream's coroutines run on these threads, each with its
# database connection: a stream process holds this many connections however many follow.
READ_THREADS = 4
# Redis away: the first pause before subscribing again, and the longest.
RESUBSCRIBE_FIRST_SECONDS = 0.5
RESUBSCRIBE_MAX_SECONDS = 10.0
# How often an idle subscription asks Redis whether it is still there, and how long its
# answer may take: a hung Redis (its kernel still takes every byte, nothing answers) gives
# no socket error, only silence.
SUBSCRIPTION_PING_SECONDS = 15.0
PING_ANSWER_SECONDS = 5.0

_reads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="output-read")


def announce_output(job_id: int) -> None:
    """Tell the job's followers, once the current transaction commits, to read again."""
    announce_on_commit(settings.JOB_OUTPUT_CHANNEL, str(job_id))


# --- events ---------------------------------------------------------------------------


def retry_field() -> str:
    return f"retry: {settings.JOB_OUTPUT_FOLLOW_RETRY_MS}\n\n"


def output_event(page: OutputPage) -> str:
    start = max(page.offset, page.dropped_before)
    data: dict[str, object] = {"offset": start, "next_offset": page.next_offset, "text": page.text}
    if page.dropped:
        data["dropped"] = page.dropped
    return _event("output", page.next_offset, data)


def end_event(status: str, offset: int) -> str:
    return _event("end", offset, {"status": status, "next_offset": offset})


def _event(name: str, event_id: int, data: dict[str, object]) -> str:
    # JSON on one line: the text's own line breaks (\r included) cannot end the event.
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _page_events(job: Job, page: OutputPage) -> Iterator[str]:
    if page.text or page.dropped:
        yield output_event(page)
    if page.finished:
        yield end_event(job.status, page.next_offset)


def _full(page: OutputPage) -> bool:
    """Whether the page stopped at its limit (more is stored after it)."""
    return page.next_offset - max(page.offset, page.dropped_before) >= EVENT_MAX_CHARS


def at_end(job: Job, offset: int) -> bool:
    """The job finished and ``offset`` is past its whole log: nothing will ever follow."""
    return job.is_finished and job_output_page(job=job, offset=offset, limit=1).text == ""


def events_now(job: Job, offset: int) -> Iterator[str]:
    """The WSGI server's answer to a follower: the log after ``offset`` as it is now."""
    yield retry_field()
    while True:
        page = job_output_page(job=job, offset=offset, limit=EVENT_MAX_CHARS)
        yield from _page_events(job, page)
        if page.finished or not _full(page):
            return
        offset = page.next_offset


# --- following ------------------------------------------------------------------------


class OutputWakes:
    """One Redis subscription per stream process, waking the followers of each job."""

    def __init__(self) -> None:
        self._followers: dict[int, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task | None = None
        # Counts each job's wakes: a read begun before the latest wake may have missed
        # what it announced, so it is not shared with the followers that wake woke.
        self._wakes: dict[int, int] = defaultdict(int)
        self._reads: dict[tuple[int, int, int], asyncio.Future] = {}

    def watch(self, job_id: int) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._listen(), name="job-output-wakes")
        wake = asyncio.Event()
        self._followers[job_id].add(wake)
        return wake

    def unwatch(self, job_id: int, wake: asyncio.Event) -> None:
        followers = self._followers.get(job_id)
        if followers is not None:
            followers.discard(wake)
            if not followers:
                del self._followers[job_id]
                self._wakes.pop(job_id, None)

    def _wake(self, job_ids=None) -> None:
        for job_id, followers in list(self._followers.items()):
            if job_ids is None or job_id in job_ids:
                self._wakes[job_id] += 1
                for wake in followers:
                    wake.set()

    def read(self, job_id: int, offset: int) -> asyncio.Future:
        """The job's log after ``offset`` (the job and its page, or None when the job is
        gone), read once for all its followers at that offset since its latest wake: fifty
        followers of one job cost one read, not fifty. Await it shielded: a follower that
        goes away does not cancel the others' read."""
        key = (job_id, offset, self._wakes.get(job_id, 0))
        shared = self._reads.get(key)
        if shared is None:
            shared = asyncio.ensure_future(_read_async(job_id, offset))
            self._reads[key] = shared
            shared.add_done_callback(lambda _: self._reads.pop(key, None))
        return shared

    async def _listen(self) -> None:
        pause = RESUBSCRIBE_FIRST_SECONDS
        away = False
        while self._followers:
            client = redis.asyncio.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
                socket_timeout=SUBSCRIPTION_PING_SECONDS + settings.REDIS_SOCKET_TIMEOUT,
            )
            try:
                async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(settings.JOB_OUTPUT_CHANNEL)
                    await self._answered(pubsub)
                    if away:
                        logger.info("job output wakes: Redis answers again")
                        away = False
                    pause = RESUBSCRIBE_FIRST_SECONDS
                    # Whatever was published while nobody listened: everyone reads again.
                    self._wake()
                    await self._relay(pubsub)
            except (redis.RedisError, OSError) as exc:
                if not away:
                    logger.warning(
                        "job output wakes: Redis not answering (%s); followers read every "
                        "%g s until it does",
                        exc,
                        settings.JOB_OUTPUT_FOLLOW_POLL_SECONDS,
                    )
                    away = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, RESUBSCRIBE_MAX_SECONDS)
            finally:
                with contextlib.suppress(redis.RedisError, OSError):
                    await client.aclose()

    async def _answered(self, pubsub) -> None:
        """Redis answers a ping (a subscription sent is no proof it took: a hung Redis's
        kernel takes the bytes); what came before the answer wakes its followers."""
        await pubsub.ping()
        asked_at = time.monotonic()
        while (message := await pubsub.get_message(timeout=1.0)) is None or (
            message["type"] != "pong"
        ):
            if message is not None:
                self._wake_for(message)
            if time.monotonic() - asked_at >= PING_ANSWER_SECONDS:
                raise redis.TimeoutError(f"no answer to a ping in {PING_ANSWER_SECONDS:g} s")

    async def _relay(self, pubsub) -> None:
        quiet_since = time.monotonic()
        pinged_at = None
        while self._followers:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None:
                # Anything that comes, a wake or the ping's answer, says Redis is there.
                quiet_since = time.monotonic()
                pinged_at = None
                self._wake_for(message)
            elif pinged_at is not None:
                if time.monotonic() - pinged_at >= PING_ANSWER_SECONDS:
                    raise redis.TimeoutError(f"no answer to a ping in {PING_ANSWER_SECONDS:g} s")
            elif time.monotonic() - quiet_since >= SUBSCRIPTION_PING_SECONDS:
                await pubsub.ping()
                pinged_at = time.monotonic()

    def _wake_for(self, message) -> None:
        if message["type"] == "message":
            with contextlib.suppress(ValueError, TypeError):
                self._wake({int(message["data"])})


wakes = OutputWakes()


def _read(job_id: int, offset: int) -> tuple[Job, OutputPage] | None:
    """The job and its log after ``offset``; None when the job is gone."""
    try:
        job = Job.objects.only("id", "status").filter(pk=job_id).first()
        if job is None:
            return None
        return job, job_output_page(job=job, offset=offset, limit=EVENT_MAX_CHARS)
    except DatabaseError:
        # This thread's connection may be broken: the next read opens a new one.
        with contextlib.suppress(DatabaseError):
            connection.close()
        raise


_read_async = sync_to_async(_read, thread_sensitive=False, executor=_reads)


def _may_read(user_id: int) -> bool:
    try:
        return user_may_log_in(user_id)
    except DatabaseError:
        with contextlib.suppress(DatabaseError):
            connection.close()
        raise


_may_read_async = sync_to_async(_may_read, thread_sensitive=False, executor=_reads)


# --- bounds ---------------------------------------------------------------------------


class StreamSlots:
    """The streams this process holds, in all and per tenant. Each is a socket and a
    coroutine: unbounded, one client could open them until the process has no file
    descriptor left for anyone. Taken by the view's thread, given back on the event
    loop's when the stream ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._by_tenant: Counter[int] = Counter()

    def take(self, tenant_id: int) -> StreamSlot | None:
        """A slot for one more stream of the tenant, or None when a bound is reached."""
        with self._lock:
            if (
                self._held >= settings.JOB_OUTPUT_FOLLOW_MAX_STREAMS
                or self._by_tenant[tenant_id] >= settings.JOB_OUTPUT_FOLLOW_MAX_PER_TENANT
            ):
                return None
            self._held += 1
            self._by_tenant[tenant_id] += 1
        return StreamSlot(self, tenant_id)

    def _give_back(self, tenant_id: int) -> None:
        with self._lock:
            self._held -= 1
            self._by_tenant[tenant_id] -= 1
            if not self._by_tenant[tenant_id]:
                del self._by_tenant[tenant_id]


class StreamSlot:
    def __init__(self, slots: StreamSlots, tenant_id: int) -> None:
        self._slots = slots
        self._tenant_id = tenant_id
        self._given_back = False
        self._lock = threading.Lock()

    def give_back(self) -> None:
        """Once, whoever calls it first: the stream's end, or its collection."""
        with self._lock:
            if self._given_back:
                return
            self._given_back = True
        self._slots._give_back(self._tenant_id)


slots = StreamSlots()


@dataclass(frozen=True)
class Reader:
    """Who follows a stream, and until when their access token is good (Unix time)."""

    user_id: int
    tenant_id: int
    token_expires_at: float


def follow_for(reader: Reader, job_id: int, offset: int) -> AsyncIterator[str] | None:
    """``follow`` for ``reader`` in one of this process's slots; None when none is free."""
    slot = slots.take(reader.tenant_id)
    if slot is None:
        return None
    events = follow(job_id, offset, reader=reader, slot=slot)
    # A stream whose client left before it began never runs its ``finally``: its slot is
    # given back when the stream is collected.
    weakref.finalize(events, slot.give_back)
    return events


async def follow(
    job_id: int, offset: int, *, reader: Reader | None = None, slot: StreamSlot | None = None
) -> AsyncIterator[str]:
    """The job's log after ``offset`` as it grows, until the job ends (``end``), the
    stream has lasted JOB_OUTPUT_FOLLOW_MAX_SECONDS (the client resumes where it was),
    the reader's access token expires, or the reader may no longer log in (the client's
    next request is refused as any would be)."""
    wake = wakes.watch(job_id)
    # The read and the reader's check in progress. Neither is waited on for longer than a
    # keep-alive: a database that does not answer (a hung server, a network that drops
    # every packet) leaves a read waiting on a socket that tells nothing for many minutes,
    # and the stream must keep its keep-alive, its end and its reader's check meanwhile.
    # Each is waited on again, never asked again, until it answers: a stream adds one
    # read at most to the threads' queue, however long the database is silent.
    reading: asyncio.Future | None = None
    silent: asyncio.Future | None = None
    checking: asyncio.Future | None = None
    try:
        yield retry_field()
        keepalive = settings.JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS
        closes_at = time.monotonic() + settings.JOB_OUTPUT_FOLLOW_MAX_SECONDS
        if reader is not None:
            closes_at = min(closes_at, time.monotonic() + reader.token_expires_at - time.time())
        said_at = checked_at = time.monotonic()
        pause = settings.JOB_OUTPUT_FOLLOW_POLL_SECONDS
        while time.monotonic() < closes_at:
            if reader is not None:
                if checking is not None and checking.done():
                    may_read, checking = checking.result(), None
                    if not may_read:
                        return
                if checking is None and time.monotonic() - checked_at >= keepalive:
                    checked_at = time.monotonic()
                    checking = asyncio.ensure_future(_still_may_read(reader))
            if reading is None:
                wake.clear()
                reading = wakes.read(job_id, offset)
            try:
                until_closed = max(closes_at - time.monotonic(), 0)
                read = await asyncio.wait_for(
                    asyncio.shield(reading), timeout=min(keepalive, until_closed)
                )
            except TimeoutError:
                if silent is not reading and time.monotonic() < closes_at:
                    silent = reading
                    logger.warning(
                        "job %s output: the log could not be read (no answer in %g s)",
                        job_id,
                        keepalive,
                    )
                if time.monotonic() - said_at >= keepalive:
                    said_at = time.monotonic()
                    yield ": still running\n\n"
                continue
            except DatabaseError as exc:
                reading = None
                logger.warning("job %s output: the log could not be read (%s)", job_id, exc)
                read = False
            else:
                reading = None
            if read is None:
                return
            if read:
                job, page = read
                pause = settings.JOB_OUTPUT_FOLLOW_POLL_SECONDS
                for event in _page_events(job, page):
                    said_at = time.monotonic()
                    yield event
                offset = page.next_offset
                if page.finished:
                    return
                if _full(page):
                    continue
            else:
                # The database is away: ask it less often until it answers.
                pause = min(pause * 2, RESUBSCRIBE_MAX_SECONDS)
            if time.monotonic() - said_at >= keepalive:
                said_at = time.monotonic()
                yield ": still running\n\n"
            until_closed = max(closes_at - time.monotonic(), 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=min(pause, until_closed))
    finally:
        if checking is not None:
            checking.cancel()
        wakes.unwatch(job_id, wake)
        if slot is not None:
            slot.give_back()


async def _still_may_read(reader: Reader) -> bool:
    try:
        return await _may_read_async(reader.user_id)
    except DatabaseError as exc:
        # Not known while the database is away: the stream goes on, and asks again.
        logger.warning("job output stream: its reader could not be checked (%s)", exc)
        return True
