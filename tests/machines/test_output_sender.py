"""A running command's output on its way to the hub: in numbered chunks, gathered by size
and time, sent again while the hub does not answer, and bounded while it cannot."""

from __future__ import annotations

import threading
import time

from automation.agent.client import HubError
from automation.agent.output import CLOSE_SECONDS, STOPPING_CLOSE_SECONDS, OutputSender
from tests.polling import wait_until


class OutputHub:
    """The hub's output endpoint in memory: chunks by seq, stored once; ``down`` answers
    as an unreachable hub does."""

    def __init__(self) -> None:
        self.chunks: dict[int, str] = {}
        self.requests = 0
        self.down = threading.Event()
        self.refusal: HubError | None = None

    def output(self, job_id, token, *, seq, text) -> dict:
        self.requests += 1
        if self.down.is_set():
            raise HubError(f"POST /jobs/{job_id}/output: hub unreachable")
        if self.refusal is not None:
            raise self.refusal
        assert seq == len(self.chunks) or seq in self.chunks, f"seq {seq} out of order"
        self.chunks.setdefault(seq, text)
        return {"stored": True}

    @property
    def text(self) -> str:
        return "".join(self.chunks[seq] for seq in sorted(self.chunks))


def sender(hub, **limits) -> OutputSender:
    return OutputSender(hub, job_id=7, claim_token="t", **limits)


def test_a_chatty_commands_lines_go_in_a_few_chunks_in_order():
    hub = OutputHub()
    output = sender(hub, flush_chars=1000, flush_seconds=5)

    for n in range(500):
        output.write(f"line {n}\n")

    assert output.close() is True
    assert hub.text == "".join(f"line {n}\n" for n in range(500))
    assert sorted(hub.chunks) == list(range(len(hub.chunks)))
    assert hub.requests == len(hub.chunks) <= 5


def test_a_quiet_commands_line_is_sent_after_the_flush_time_without_closing():
    hub = OutputHub()
    output = sender(hub, flush_chars=1000, flush_seconds=0.1)

    output.write("only line\n")

    wait_until(lambda: hub.text == "only line\n", timeout=5, message=lambda: repr(hub.chunks))
    output.close()


def test_a_chunk_the_hub_did_not_take_is_sent_again_with_its_number():
    hub = OutputHub()
    hub.down.set()
    output = sender(hub, flush_chars=1000, flush_seconds=0.05)
    output.write("first\n")
    wait_until(lambda: hub.requests >= 2, timeout=10)

    hub.down.clear()
    output.write("second\n")

    assert output.close() is True
    assert hub.text == "first\nsecond\n"


def test_while_the_hub_is_away_the_oldest_output_is_dropped_with_a_marker():
    hub = OutputHub()
    hub.down.set()
    output = sender(hub, flush_chars=50, flush_seconds=0.05, buffer_chars=100)
    output.write("a" * 10)
    # The first chunk is in hand, tried again and again: what follows waits in the buffer.
    wait_until(lambda: hub.requests >= 1, timeout=10)
    for _ in range(30):
        output.write("b" * 10)

    hub.down.clear()

    assert output.close() is True
    assert hub.text == "a" * 10 + "[... 200 characters dropped: the hub was unreachable ...]\n" + (
        "b" * 100
    )


def test_a_refused_chunk_stops_the_sending():
    hub = OutputHub()
    hub.refusal = HubError("POST /jobs/7/output: 409 stale_claim", status=409, code="stale_claim")
    output = sender(hub, flush_chars=10, flush_seconds=0.05)
    output.write("x" * 10)
    wait_until(lambda: hub.requests == 1, timeout=5)

    output.write("y" * 30)

    assert output.close() is False
    assert hub.requests == 1 and hub.chunks == {}


def test_a_stopping_worker_does_not_wait_out_an_unreachable_hub_for_its_output():
    """The end of a command waits for its last chunks (CLOSE_SECONDS); a worker that is
    stopping has spent its stop budget on the command already, and its report must reach
    the disk before whoever stops it gives up waiting: the output waits a moment only."""
    hub = OutputHub()
    hub.down.set()
    stopping = threading.Event()
    stopping.set()
    output = sender(hub, flush_chars=1000, flush_seconds=0.05)
    output.write("last words\n")
    wait_until(lambda: hub.requests >= 1, timeout=10)

    started = time.monotonic()
    assert output.close(stopping=stopping) is False
    assert time.monotonic() - started < STOPPING_CLOSE_SECONDS + 2 < CLOSE_SECONDS


def test_a_stop_that_comes_while_the_output_is_waited_for_cuts_the_wait_short():
    hub = OutputHub()
    hub.down.set()
    stopping = threading.Event()
    output = sender(hub, flush_chars=1000, flush_seconds=0.05)
    output.write("last words\n")
    wait_until(lambda: hub.requests >= 1, timeout=10)

    threading.Timer(0.5, stopping.set).start()
    started = time.monotonic()
    assert output.close(stopping=stopping) is False
    assert time.monotonic() - started < 0.5 + STOPPING_CLOSE_SECONDS + 2 < CLOSE_SECONDS


def test_a_stopping_worker_still_sends_output_the_hub_takes():
    hub = OutputHub()
    stopping = threading.Event()
    stopping.set()
    output = sender(hub, flush_chars=1000, flush_seconds=5)
    output.write("last words\n")

    assert output.close(stopping=stopping) is True
    assert hub.text == "last words\n"


def test_what_a_close_could_not_send_is_handed_over_numbered_where_the_sending_stopped():
    hub = OutputHub()
    output = sender(hub, flush_chars=20, flush_seconds=0.05)
    output.write("line 0\n")
    wait_until(lambda: hub.text == "line 0\n", timeout=10, message=lambda: repr(hub.chunks))
    hub.down.set()
    output.write("line 1\n")
    # Chunk 1 in hand, tried again and again; the rest waits in the buffer.
    wait_until(lambda: hub.requests >= 3, timeout=10)
    for n in range(2, 10):
        output.write(f"line {n}\n")

    assert output.close(timeout=0.3) is False
    unsent = output.unsent()

    assert unsent is not None and unsent.seq == 1
    assert "".join(unsent.chunks) == "".join(f"line {n}\n" for n in range(1, 10))
    assert all(len(chunk) <= 20 for chunk in unsent.chunks)
    # Sent later in that order (the first may reach the hub twice), the log is whole.
    hub.down.clear()
    hub.output(7, "t", seq=1, text=unsent.chunks[0])
    for seq, text in enumerate(unsent.chunks, start=unsent.seq):
        hub.output(7, "t", seq=seq, text=text)
    assert hub.text == "".join(f"line {n}\n" for n in range(10))


def test_nothing_is_handed_over_when_everything_went_or_the_hub_refused_the_output():
    hub = OutputHub()
    output = sender(hub, flush_chars=1000, flush_seconds=5)
    output.write("all of it\n")
    assert output.close() is True
    assert output.unsent() is None

    refusing = OutputHub()
    refusing.refusal = HubError("POST /jobs/7/output: 409 stale_claim", status=409)
    output = sender(refusing, flush_chars=10, flush_seconds=0.05)
    output.write("x" * 30)
    assert output.close(timeout=5) is False
    assert output.unsent() is None
