import pytest

from outbox import listeners
from outbox.listeners import RecordedEvent, register_event_listener


@pytest.fixture
def heard(monkeypatch):
    """The events the listeners hear during the test (the registry as it was, after it)."""
    monkeypatch.setattr(listeners, "_listeners", dict(listeners._listeners))
    monkeypatch.setattr(listeners, "_batch_listeners", dict(listeners._batch_listeners))
    events: list[RecordedEvent] = []
    register_event_listener("test.heard", events.append)
    return events
