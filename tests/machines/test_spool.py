"""The outcome spool read while reports come and go: another thread (a report delivered
meanwhile) or another worker of the machine may remove a file between the listing and
its reading."""

from __future__ import annotations

import threading
import time

from automation.agent.spool import OutcomeSpool


def report(job_id: int) -> dict:
    return {
        "job_id": job_id,
        "claim_token": f"token-{job_id}",
        "kind": "complete",
        "body": {"result": {}, "output_tail": "", "exit_code": 0},
    }


def test_reports_removed_while_the_spool_is_listed_are_left_out_not_an_error(tmp_path):
    spool = OutcomeSpool(tmp_path / "outcomes")
    kept = report(1)
    spool.put(kept)
    done = threading.Event()

    def come_and_go() -> None:
        # Reports written and delivered, again and again.
        while not done.is_set():
            for job_id in range(2, 12):
                spool.put(report(job_id))
            for job_id in range(2, 12):
                spool.remove(report(job_id))

    churn = threading.Thread(target=come_and_go, daemon=True)
    churn.start()
    listings = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            pending = spool.pending()
            listings += 1
            assert kept in pending
            assert all(int(r["job_id"]) in range(1, 12) for r in pending)
    finally:
        done.set()
        churn.join(10)
    assert listings > 10
