"""What a sector classifies, as the apps above it count it.

A sector still classifying an active automation cannot be deactivated, yet the sector
app stands below the automation app (an automation names its sector; a sector knows no
automation). So the apps that file things under a sector register a counter here when
Django starts them (``AppConfig.ready``), and the sector's services ask through it: the
rule stays with the sector, the dependency points one way only.
"""

from __future__ import annotations

from collections.abc import Callable

# (what it counts, as shown in a refusal's details) -> how many of those a sector holds.
SectorUsage = Callable[[int], int]

_counters: dict[str, SectorUsage] = {}


def register_sector_usage(name: str, counter: SectorUsage) -> None:
    """Count ``name`` (e.g. ``"active_automations"``) among what keeps a sector in use."""
    _counters[name] = counter


def sector_usage(sector_id: int) -> dict[str, int]:
    """What still uses the sector, by name; only the counts above zero."""
    counts = {name: counter(sector_id) for name, counter in _counters.items()}
    return {name: count for name, count in counts.items() if count}
