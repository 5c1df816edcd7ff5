"""A Server-Sent Events client for the tests: reads a job's output stream as an EventSource
would (each event's id kept and sent back as ``Last-Event-ID`` when it reconnects)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import requests


@dataclass(frozen=True)
class Event:
    id: str | None
    name: str
    data: str
    received_at: float

    @property
    def json(self):
        return json.loads(self.data)


def read_events(response: requests.Response):
    """The events of an open ``text/event-stream`` response, as they come (comments and
    ``retry`` fields skipped)."""
    event_id, name, data = None, "message", []
    for line in response.iter_lines(chunk_size=None, decode_unicode=True):
        if line == "":
            if data:
                yield Event(event_id, name, "\n".join(data), time.time())
            name, data = "message", []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "id":
            event_id = value
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)


@dataclass
class Follower:
    """Follows ``url`` in a thread until an ``end`` event, reconnecting (after ``pause``)
    whenever the stream breaks or closes, from the last event id it got."""

    url: str
    headers: dict[str, str]
    pause: float = 0.2
    give_up_after: float = 120.0
    events: list[Event] = field(default_factory=list)
    connections: int = 0
    statuses: list[int] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Follower:
        self._thread = threading.Thread(target=self._run, daemon=True, name="sse-follower")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following. A thread still waiting on an open stream ends when its server
        closes it (the tests stop their servers) or with the process: it is a daemon."""
        self._stop.set()
        self._thread.join(0.2)

    @property
    def last_id(self) -> str | None:
        ids = [event.id for event in self.events if event.id is not None]
        return ids[-1] if ids else None

    def text(self) -> str:
        return "".join(event.json["text"] for event in self.events if event.name == "output")

    def _run(self) -> None:
        gives_up_at = time.monotonic() + self.give_up_after
        while not self._stop.is_set() and time.monotonic() < gives_up_at:
            headers = dict(self.headers)
            if self.last_id is not None:
                headers["Last-Event-ID"] = self.last_id
            try:
                with requests.get(self.url, headers=headers, stream=True, timeout=(2, 30)) as r:
                    self.connections += 1
                    self.statuses.append(r.status_code)
                    if r.status_code == 204:
                        self.ended.set()
                        return
                    if r.status_code == 200:
                        for event in read_events(r):
                            self.events.append(event)
                            if event.name == "end":
                                self.ended.set()
                                return
                            if self._stop.is_set():
                                return
            except (requests.RequestException, OSError):
                pass
            self._stop.wait(self.pause)
