"""The handlers this worker runs: every installed app's ``tasks`` module, imported once.

Registration itself (``@task``) lives in ``outbox.handlers``, beside the catalog, so that an
app's ``tasks.py`` never imports the worker.
"""

from __future__ import annotations

from django.utils.module_loading import autodiscover_modules

from outbox.catalog import Catalog
from outbox.handlers import Handler, registered


def discover_handlers() -> dict[str, Handler]:
    """Import every installed app's ``tasks`` module (the worker only)."""
    autodiscover_modules("tasks")
    return registered()


def missing_handlers(catalog: Catalog, destinations: list[str], handlers: dict[str, Handler]):
    """Tasks routed to these queues that no handler here runs (sorted by name)."""
    return sorted(
        spec.name
        for spec in catalog.tasks.values()
        if spec.destination == "queue" and spec.queue in destinations and spec.name not in handlers
    )
