"""Running one claimed job: the automation's command as a subprocess.

The job's parameters reach the command twice, as JSON on its standard input and in
``HUBDOMMED_JOB_PARAMS``. Standard output and error are merged: the hub receives them
while the command runs (``OutputSender``), and their tail comes with the report. While
the command runs, the executor heartbeats the claim; it stops the command (its whole
process group: SIGTERM, then SIGKILL after a grace period) when the job is canceled, when
it outlives the automation's timeout, or when the worker shuts down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from automation.agent.client import HubClient, HubError
from automation.agent.output import OutputSender, UnsentOutput
from lifecycle import Backoff

logger = logging.getLogger("hubdommed.agent")

OUTPUT_TAIL_CHARS = 8_000
KILL_GRACE_SECONDS = 5.0
# How often a running command's executor looks at the shutdown flag.
STOP_CHECK_SECONDS = 0.2


@dataclass
class Outcome:
    succeeded: bool
    reason: str = ""  # "", "exit_code", "timeout", "canceled", "error"
    exit_code: int | None = None
    output_tail: str = ""
    error: str = ""
    # The claim was lost (the hub refused a heartbeat): nothing can be reported.
    claim_lost: bool = False
    # Output the hub did not take before the command's end was reported: it goes with
    # the report, before the outcome.
    unsent_output: UnsentOutput | None = None


class OutputTail:
    """Keeps the last ``limit`` characters of a stream, read on its own thread."""

    def __init__(self, stream, limit: int = OUTPUT_TAIL_CHARS, *, on_text=None) -> None:
        self._chunks: deque[str] = deque()
        self._size = 0
        self._limit = limit
        self._lock = threading.Lock()
        # Called with each piece read, on the reader's thread (OutputSender.write).
        self._on_text = on_text
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(4096), b""):
            text = chunk.decode("utf-8", errors="replace")
            if self._on_text is not None:
                self._on_text(text)
            with self._lock:
                self._chunks.append(text)
                self._size += len(text)
                while self._size - len(self._chunks[0]) >= self._limit:
                    self._size -= len(self._chunks.popleft())
        stream.close()

    def text(self, *, wait: float = 0) -> str:
        if wait:
            self._thread.join(wait)
        with self._lock:
            return "".join(self._chunks)[-self._limit :]


def run_claimed_job(
    client: HubClient,
    *,
    job: dict[str, Any],
    command: list[str],
    timeout_seconds: float,
    heartbeat_interval: float,
    stopping: threading.Event,
) -> Outcome:
    job_id, token = job["id"], str(job["claim_token"])
    params = json.dumps(job.get("params") or {})
    env = {
        **os.environ,
        "HUBDOMMED_JOB_ID": str(job_id),
        "HUBDOMMED_JOB_ATTEMPT": str(job.get("attempt", 1)),
        "HUBDOMMED_JOB_PARAMS": params,
    }
    # The worker's own secret is not the command's business.
    env.pop("HUBDOMMED_WORKER_CREDENTIAL", None)
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(False, reason="error", error=f"cannot start the command: {exc}")

    threading.Thread(target=_feed, args=(process.stdin, params.encode()), daemon=True).start()
    sender = OutputSender(client, job_id=job_id, claim_token=token)
    output = OutputTail(process.stdout, on_text=sender.write)
    deadline = time.monotonic() + timeout_seconds
    next_beat = time.monotonic() + heartbeat_interval
    # A beat the hub did not answer is tried again sooner than the next one is due, so
    # that a short outage of the hub costs the lease as little as possible.
    backoff = Backoff(0.5, heartbeat_interval, jitter=True)
    stop_reason = ""
    while True:
        # Short waits: a shutdown must not wait for the next heartbeat to be noticed.
        wait = min(next_beat, deadline) - time.monotonic()
        try:
            process.wait(timeout=max(0.0, min(STOP_CHECK_SECONDS, wait)))
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now >= deadline:
            stop_reason = "timeout"
        elif stopping.is_set():
            stop_reason = "shutdown"
        elif now >= next_beat:
            next_beat = now + heartbeat_interval
            try:
                beat = client.heartbeat(job_id, token)
            except HubError as exc:
                if exc.status == 409:
                    # Someone else decided this job's fate (the monitor, a cancel that
                    # finished it): stop working on it.
                    logger.info("job %s: claim lost (%s); stopping its command", job_id, exc.code)
                    _stop(process)
                    sender.abandon()
                    return Outcome(
                        False, reason="error", claim_lost=True, output_tail=output.text()
                    )
                if exc.retryable:
                    next_beat = now + min(heartbeat_interval, backoff.failed())
                logger.warning("job %s: heartbeat failed, will retry: %s", job_id, exc)
            else:
                backoff.reset()
                if beat.get("cancel_requested"):
                    stop_reason = "canceled"
        if stop_reason:
            _stop(process)
            break

    tail = output.text(wait=2)
    # The last chunks reach the hub before the report that ends the job (which refuses
    # output from then on); a stopping worker waits for them a moment only. What the hub
    # did not take by then goes with the report, ahead of the outcome.
    unsent = None if sender.close(stopping=stopping) else sender.unsent()
    outcome = _outcome(stop_reason, process.returncode, tail, timeout_seconds)
    return replace(outcome, unsent_output=unsent)


def _outcome(stop_reason: str, code: int | None, tail: str, timeout_seconds: float) -> Outcome:
    if stop_reason == "timeout":
        return Outcome(False, "timeout", code, tail, f"timed out after {timeout_seconds:g} s")
    if stop_reason == "canceled":
        return Outcome(False, "canceled", code, tail, "canceled at the requester's demand")
    if stop_reason == "shutdown":
        return Outcome(False, "error", code, tail, "the worker shut down before the command ended")
    if code == 0:
        return Outcome(True, exit_code=0, output_tail=tail)
    return Outcome(False, "exit_code", code, tail, f"the command exited with code {code}")


def _feed(stdin, data: bytes) -> None:
    try:
        stdin.write(data)
    except (BrokenPipeError, OSError):
        pass  # the command does not read its input: fine
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the command's process group, SIGKILL it after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
