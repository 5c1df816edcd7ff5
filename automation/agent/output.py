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

The end of a command waits a while for its last chunks (``close``). What the hub has not
taken by then is not dropped: ``unsent`` hands it over, numbered where the sending stopped,
and it goes with the job's report (kept on disk, sent before the outcome): the job's log
gets every line even when the hub was away as the command ended.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from automation.agent.client import HubClient, HubError
from lifecycle import Backoff

logger = logging.getLogger("hubdommed.agent")

FLUSH_CHARS = 16 * 1024
FLUSH_SECONDS = 0.5
BUFFER_CHARS = 1_000_000
# How long the end of a command waits for its last chunks to reach the hub.
CLOSE_SECONDS = 10.0
# How much longer once the worker is stopping: its stop budget went to the command, and
# its report must be on disk before whoever stops it stops waiting (what was not sent goes
# with the report).
STOPPING_CLOSE_SECONDS = 1.0
# How often a close looks at the stop while it waits.
CLOSE_SLICE_SECONDS = 0.1


def dropped_marker(count: int) -> str:
    return f"[... {count} characters dropped: the hub was unreachable ...]\n"


@dataclass(frozen=True)
class UnsentOutput:
    """Output the hub has not taken yet: ``chunks`` to be sent as ``seq``, ``seq`` + 1..."""

    seq: int
    chunks: list[str]

    def as_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "chunks": self.chunks}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> UnsentOutput:
        seq, chunks = data["seq"], data["chunks"]
        if not isinstance(seq, int) or not isinstance(chunks, list):
            raise ValueError(f"not unsent output: {data!r}")
        return cls(seq=seq, chunks=[str(chunk) for chunk in chunks])


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
        # The chunk taken from the buffer and not taken by the hub yet (number ``_seq``).
        self._in_hand: str | None = None
        self._closing = False
        self._gave_up = threading.Event()
        # The hub refused a chunk: nothing more of this output would be taken.
        self._refused = False
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
        self, *, timeout: float | None = None, stopping: threading.Event | None = None
    ) -> bool:
        """Send what is left (for at most ``timeout`` seconds, CLOSE_SECONDS unless said,
        and at most ``STOPPING_CLOSE_SECONDS`` once ``stopping`` is set, before the wait or
        during it); True if all of it went (else see ``unsent``)."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        deadline = time.monotonic() + (CLOSE_SECONDS if timeout is None else timeout)
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
        self._refused = True
        self._gave_up.set()
        self.close(timeout=0)

    def unsent(self) -> UnsentOutput | None:
        """What a ``close`` that gave up leaves: the chunk in hand and the rest of the
        buffer, in chunks numbered from where the sending stopped; None when everything
        went, or when the hub refused the output (it would refuse it again).

        The sending thread may still be in its last request: if the hub takes that chunk
        after all, sending it again under the same number stores nothing."""
        with self._changed:
            if self._refused:
                return None
            chunks = [self._in_hand] if self._in_hand is not None else []
            while self._size or self._dropped:
                chunks.append(self._take())
            self._in_hand = None
            return UnsentOutput(seq=self._seq, chunks=chunks) if chunks else None

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
            with self._changed:
                if self._in_hand is chunk:
                    self._in_hand = None
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
                        self._in_hand = self._take()
                        return self._in_hand
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
            self._refused = True
            self._gave_up.set()
        return True
