"""Outcomes kept on the machine's disk until the hub has them.

The worker writes a job's outcome here before its first attempt to report it, and
deletes it once the hub took it (or refused it for good: a claim that is not the job's
any more, a job already finished). A worker that stops before the hub answered, or a
machine that loses power, leaves the file; the next worker on the machine reports it
before anything else. Each outcome is one JSON file, written whole or not at all: a
temporary file, fsync, rename, then fsync of the folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger("hubdommed.agent")

# A spooled report: {"job_id": int, "claim_token": str, "kind": "complete"|"fail",
# "body": {...the request's fields but the claim token...}, and "output": {"seq": int,
# "chunks": [str, ...]} when the hub had not taken all of the command's output: sent first}.
Report = dict[str, Any]


class OutcomeSpool:
    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def put(self, report: Report) -> Path:
        """Keep ``report`` durably (it survives a crash once this returns)."""
        path = self._path(report)
        data = json.dumps(report, separators=(",", ":")).encode()
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        self._sync_directory()
        return path

    def remove(self, report: Report) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(report).unlink()
        self._sync_directory()

    def pending(self) -> list[Report]:
        """The reports kept, oldest first. An unreadable file (cut short by a crash before
        its rename cannot be: only a disk fault) is set aside, not reported."""
        reports = []
        for path in self._oldest_first():
            try:
                report = json.loads(path.read_bytes())
                int(report["job_id"]), str(report["claim_token"]), report["kind"]
            except FileNotFoundError:
                continue  # reported and removed meanwhile
            except (ValueError, KeyError, TypeError):
                logger.error("unreadable outcome %s: set aside as %s.bad", path, path.name)
                with contextlib.suppress(FileNotFoundError):
                    path.rename(path.with_suffix(".bad"))
                continue
            reports.append(report)
        return reports

    def _oldest_first(self) -> list[Path]:
        """The files, oldest first; one removed between the listing and its look (its
        report delivered meanwhile, by this worker or another) is left out."""
        dated = []
        for path in self.directory.glob("job-*.json"):
            with contextlib.suppress(FileNotFoundError):
                dated.append((path.stat().st_mtime, path))
        return [path for _, path in sorted(dated)]

    def _path(self, report: Report) -> Path:
        return self.directory / f"job-{int(report['job_id'])}-{report['claim_token']}.json"

    def _sync_directory(self) -> None:
        # The rename (or unlink) itself is durable only once the folder is.
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
