"""The tasks catalog (``tasks.json``): tasks, the events they subscribe to, schedules.

The hub reads it to find an event's subscribers without importing their code.
Loading validates everything, so a bad catalog stops the process at start-up.

A task's ``destination`` says where its messages go: ``queue`` (the default,
the queue class's shared queue) or ``automation`` (the own queue of the
automation named by ``payload["automation_id"]``, for that automation's worker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from broker.topology import QUEUES

DESTINATIONS = ("queue", "automation")
# Seconds a task's handler may run before the worker abandons it and retries the run
# (``time_limit_seconds`` per task, or in ``defaults``).
DEFAULT_TIME_LIMIT_SECONDS = 300.0


@dataclass(frozen=True)
class RetryPolicy:
    max_receives: int = 5
    backoff_seconds: float = 2.0
    backoff_max_seconds: float = 600.0

    def backoff(self, receive_count: int) -> float:
        """Exponential delay (before jitter) after the given receive."""
        return min(self.backoff_max_seconds, self.backoff_seconds * 2 ** max(0, receive_count - 1))


@dataclass(frozen=True)
class TaskSpec:
    name: str
    queue: str
    subscribes: tuple[str, ...] = ()
    destination: str = "queue"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    description: str = ""
    time_limit_seconds: float = DEFAULT_TIME_LIMIT_SECONDS


@dataclass(frozen=True)
class Schedule:
    name: str
    task: str
    every_seconds: int
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Catalog:
    events: frozenset[str]
    tasks: dict[str, TaskSpec]
    schedules: tuple[Schedule, ...]

    def task(self, name: str) -> TaskSpec:
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTask(f"unknown task {name!r}: it is not declared in tasks.json") from None

    def subscribers(self, event: str) -> list[TaskSpec]:
        if event not in self.events:
            raise UnknownEvent(f"unknown event {event!r}: it is not declared in tasks.json")
        return [spec for spec in self.tasks.values() if event in spec.subscribes]


class CatalogError(ImproperlyConfigured):
    pass


class UnknownTask(LookupError):
    pass


class UnknownEvent(LookupError):
    pass


def parse_catalog(data: Any, *, source: str = "tasks.json") -> Catalog:
    def fail(message: str) -> CatalogError:
        return CatalogError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("the top level must be an object")
    events = data.get("events", [])
    if not isinstance(events, list) or not all(isinstance(e, str) and e for e in events):
        raise fail("'events' must be a list of event names")
    if len(set(events)) != len(events):
        raise fail(f"duplicate event names: {sorted({e for e in events if events.count(e) > 1})}")

    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise fail("'defaults' must be an object")
    default_retry = _retry(defaults.get("retry", {}), RetryPolicy(), fail, "defaults")
    default_limit = _time_limit(
        defaults.get("time_limit_seconds", DEFAULT_TIME_LIMIT_SECONDS), fail, "defaults"
    )
    tasks: dict[str, TaskSpec] = {}
    for position, raw in enumerate(data.get("tasks", [])):
        where = f"tasks[{position}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise fail(f"{where} needs a 'name'")
        name = raw["name"]
        if name in tasks:
            raise fail(f"duplicate task name {name!r}")
        queue = raw.get("queue")
        if queue not in QUEUES:
            raise fail(f"task {name!r} has unknown queue {queue!r} (known: {', '.join(QUEUES)})")
        subscribes = raw.get("subscribes", [])
        if not isinstance(subscribes, list):
            raise fail(f"task {name!r}: 'subscribes' must be a list")
        for event in subscribes:
            if event not in events:
                raise fail(f"task {name!r} subscribes to undeclared event {event!r}")
        destination = raw.get("destination", "queue")
        if destination not in DESTINATIONS:
            raise fail(f"task {name!r} has unknown destination {destination!r}")
        tasks[name] = TaskSpec(
            name=name,
            queue=queue,
            subscribes=tuple(subscribes),
            destination=destination,
            retry=_retry(raw.get("retry", {}), default_retry, fail, f"task {name!r}"),
            description=str(raw.get("description", "")),
            time_limit_seconds=_time_limit(
                raw.get("time_limit_seconds", default_limit), fail, f"task {name!r}"
            ),
        )

    schedules: list[Schedule] = []
    for position, raw in enumerate(data.get("schedules", [])):
        where = f"schedules[{position}]"
        if not isinstance(raw, dict):
            raise fail(f"{where} must be an object")
        name, task = raw.get("name"), raw.get("task")
        if not isinstance(name, str) or not name:
            raise fail(f"{where} needs a 'name'")
        if any(s.name == name for s in schedules):
            raise fail(f"duplicate schedule name {name!r}")
        if task not in tasks:
            raise fail(f"schedule {name!r} names unknown task {task!r}")
        every = raw.get("every_seconds")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise fail(f"schedule {name!r}: 'every_seconds' must be a positive integer")
        payload = raw.get("payload", {})
        if not isinstance(payload, dict):
            raise fail(f"schedule {name!r}: 'payload' must be an object")
        schedules.append(Schedule(name=name, task=task, every_seconds=every, payload=payload))

    return Catalog(events=frozenset(events), tasks=tasks, schedules=tuple(schedules))


def _retry(raw: Any, base: RetryPolicy, fail, where: str) -> RetryPolicy:
    if not isinstance(raw, dict):
        raise fail(f"{where}: 'retry' must be an object")
    unknown = set(raw) - {"max_receives", "backoff_seconds", "backoff_max_seconds"}
    if unknown:
        raise fail(f"{where}: unknown retry settings {sorted(unknown)}")
    policy = RetryPolicy(
        max_receives=raw.get("max_receives", base.max_receives),
        backoff_seconds=raw.get("backoff_seconds", base.backoff_seconds),
        backoff_max_seconds=raw.get("backoff_max_seconds", base.backoff_max_seconds),
    )
    if not (isinstance(policy.max_receives, int) and policy.max_receives >= 1):
        raise fail(f"{where}: 'max_receives' must be a positive integer")
    if policy.backoff_seconds < 0 or policy.backoff_max_seconds < policy.backoff_seconds:
        raise fail(f"{where}: backoff must be non-negative and at most backoff_max_seconds")
    return policy


def _time_limit(raw: Any, fail, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw > 0:
        raise fail(f"{where}: 'time_limit_seconds' must be a positive number of seconds")
    return float(raw)


def load_catalog(path: Path | str) -> Catalog:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CatalogError(f"tasks catalog not found at {path} (setting TASKS_CATALOG)") from None
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}: not valid JSON: {exc}") from None
    return parse_catalog(data, source=str(path))


@cache
def _cached(path: str) -> Catalog:
    return load_catalog(path)


def get_catalog() -> Catalog:
    """The catalog named by ``settings.TASKS_CATALOG``, loaded once per process."""
    return _cached(str(settings.TASKS_CATALOG))
