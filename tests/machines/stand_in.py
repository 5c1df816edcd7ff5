"""What the local provider's stand-in worker process (``fake_worker_command``) recorded."""

from __future__ import annotations


def started(base) -> list[str]:
    """The starts the stand-in recorded, one complete line each: the file exists from its
    first open, before its line is written."""
    path = base / "starts"
    text = path.read_text() if path.exists() else ""
    return text.split("\n")[:-1]
