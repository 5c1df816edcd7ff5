"""The automation worker's executor: a job's command as a subprocess, stopped when asked."""

from __future__ import annotations

import sys
import threading

from automation.agent.executor import Outcome, run_claimed_job


class QuietHub:
    """The hub as the executor sees it while a job runs: heartbeats accepted."""

    def __init__(self) -> None:
        self.beats = 0

    def heartbeat(self, job_id, claim_token, progress=None):
        self.beats += 1
        return {"cancel_requested": False}


def test_a_shutdown_stops_the_command_without_waiting_for_the_next_heartbeat():
    stopping = threading.Event()
    outcomes: list[Outcome] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        outcomes.append(
            run_claimed_job(
                QuietHub(),
                job={"id": 1, "claim_token": "token", "params": {}},
                command=[sys.executable, "-c", "import time; time.sleep(60)"],
                # The job's own limit ends this test in any case; a beat is due only then.
                timeout_seconds=30,
                heartbeat_interval=30,
                stopping=stopping,
            )
        )

    runner = threading.Thread(target=run)
    runner.start()
    started.wait()
    stopping.set()
    runner.join(timeout=15)
    stopped_in_time = not runner.is_alive()
    runner.join()

    assert stopped_in_time, "the command ran on until the next heartbeat was due"
    assert outcomes[0].reason == "error"
    assert "shut down" in outcomes[0].error
