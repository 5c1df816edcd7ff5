"""A running command's output, sent to the hub while the command runs.

The command's reader hands each piece it reads to ``OutputSender.write``, which only
appends it to a bounded buffer: sending never slows the command. A thread of the sender's
own gathers the buffer into chunks (at ``flush_chars``, or ``flush_seconds`` after the
first unsent character, whichever comes first: a chatty command makes no request per
line, a quiet one shows its lines within a second) and sends them in order, numbered
``seq`` 0, 1, 2... so that the hub stores a retried chunk once.

While the hub does not answer, the chunk in hand is tried again with growing pauses
(``lifecycle.Backoff``) and the buffer keeps filling; once it holds ``buffer_chars``, its
oldest characters are dropped, and the next chunk begins with a line saying how many.
A refusal (the claim was lost, the job ended) stops the sending for good.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque

from automation.agent.client import HubClient, HubError
from lifecycle import Backoff

logger = logging.getLogger("hubdommed.agent")

FLUSH_CHARS = 16 * 1024
FLUSH_SECONDS = 0.5
BUFFER_CHARS = 1_000_000
# How long the end of a command waits for its last chunks to reach the hub.
CLOSE_SECONDS = 10.0
# How much longer once the worker is stopping: its stop budget went to the command, and
# its report must be on disk before whoever stops it stops waiting (the report's
# output_tail keeps the end of the output either way).
STOPPING_CLOSE_SECONDS = 1.0
# How often a close looks at the stop while it waits.
CLOSE_SLICE_SECONDS = 0.1


def dropped_marker(count: int) -> str:
    return f"[... {count} characters dropped: the hub was unreachable ...]\n"


class OutputSender:
    def __init__(
        self,
        client: HubClient,
        *,
        job_id: int,
        claim_token: str,
        flush_chars: int = FLUSH_CHARS,
        flush_seconds: float = FLUSH_SECONDS,
        buffer_chars: int = BUFFER_CHARS,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.claim_token = claim_token
        self.flush_chars = flush_chars
        self.flush_seconds = flush_seconds
        self.buffer_chars = buffer_chars
        self._buffer: deque[str] = deque()
        self._size = 0
        # Characters dropped from the buffer's front since the last chunk was taken.
        self._dropped = 0
        # When the oldest unsent character came (monotonic), None while nothing waits.
        self._since: float | None = None
        self._seq = 0
        self._closing = False
        self._gave_up = threading.Event()
        self._changed = threading.Condition()
        # The thread's requests carry the job's ids, as this thread's do (client.for_job).
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run,), name=f"output-{job_id}", daemon=True
        )
        self._thread.start()

    def write(self, text: str) -> None:
        """Keep ``text`` for the next chunk; never waits for the hub."""
        if not text or self._gave_up.is_set():
            return
        with self._changed:
            if self._closing:
                return
            self._buffer.append(text)
            self._size += len(text)
            if self._since is None:
                # The sender waits for the first character, then for the flush time.
                self._since = time.monotonic()
                self._changed.notify()
            while self._size > self.buffer_chars:
                excess = self._size - self.buffer_chars
                oldest = self._buffer[0]
                if len(oldest) <= excess:
                    self._buffer.popleft()
                    cut = len(oldest)
                else:
                    self._buffer[0] = oldest[excess:]
                    cut = excess
                self._size -= cut
                self._dropped += cut
            if self._size >= self.flush_chars:
                self._changed.notify()

    def close(
        self, *, timeout: float = CLOSE_SECONDS, stopping: threading.Event | None = None
    ) -> bool:
        """Send what is left (for at most ``timeout`` seconds, and at most
        ``STOPPING_CLOSE_SECONDS`` once ``stopping`` is set, before the wait or during it);
        True if all of it went."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        deadline = time.monotonic() + timeout
        stopped = False
        while self._thread.is_alive():
            now = time.monotonic()
            if not stopped and stopping is not None and stopping.is_set():
                stopped = True
                deadline = min(deadline, now + STOPPING_CLOSE_SECONDS)
            if now >= deadline:
                break
            self._thread.join(min(deadline - now, CLOSE_SLICE_SECONDS))
        if self._thread.is_alive():
            logger.warning("job %s: the end of the output could not be sent in time", self.job_id)
            self._gave_up.set()
            with self._changed:
                self._changed.notify()
            return False
        return not self._gave_up.is_set()

    def abandon(self) -> None:
        """Send nothing more (the claim was lost)."""
        self._gave_up.set()
        self.close(timeout=0)

    def _run(self) -> None:
        try:
            self._send_all()
        except Exception:  # a bug here must not touch the command or its report
            logger.exception("job %s: unexpected error sending the output", self.job_id)
            self._gave_up.set()

    def _send_all(self) -> None:
        backoff = Backoff(0.5, 10.0, jitter=True)
        while not self._gave_up.is_set():
            chunk = self._next_chunk()
            if chunk is None:
                return
            while not self._send(chunk):
                if self._gave_up.is_set():
                    return
                # The pause ends early when the sender is given up.
                if self._gave_up.wait(backoff.failed()):
                    return
            backoff.reset()
            self._seq += 1

    def _next_chunk(self) -> str | None:
        """The next chunk once one is due; None when closed with nothing left."""
        with self._changed:
            while True:
                if self._gave_up.is_set():
                    return None
                if self._size or self._dropped:
                    waited = time.monotonic() - (self._since or time.monotonic())
                    if (
                        self._closing
                        or self._size >= self.flush_chars
                        or waited >= self.flush_seconds
                    ):
                        return self._take()
                    self._changed.wait(self.flush_seconds - waited)
                elif self._closing:
                    return None
                else:
                    self._changed.wait()

    def _take(self) -> str:
        marker = dropped_marker(self._dropped) if self._dropped else ""
        self._dropped = 0
        room = max(1, self.flush_chars - len(marker))
        pieces, size = [], 0
        while self._buffer and size < room:
            piece = self._buffer.popleft()
            if size + len(piece) > room:
                self._buffer.appendleft(piece[room - size :])
                piece = piece[: room - size]
            pieces.append(piece)
            size += len(piece)
        self._size -= size
        self._since = time.monotonic() if self._size else None
        return marker + "".join(pieces)

    def _send(self, text: str) -> bool:
        """One attempt; True once the hub has the chunk (or refused it for good)."""
        try:
            self.client.output(self.job_id, self.claim_token, seq=self._seq, text=text)
        except HubError as exc:
            if exc.retryable:
                logger.warning("job %s: output not sent yet, will retry: %s", self.job_id, exc)
                return False
            logger.info("job %s: the hub refuses its output; no more is sent: %s", self.job_id, exc)
            self._gave_up.set()
        return True
