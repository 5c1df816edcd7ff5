from __future__ import annotations

import pytest

from tests.factories import AutomationWithWorkerFactory
from tests.sector.conftest import (  # noqa: F401 (fixtures shared with the sector tests)
    admin_api,
    admin_site,
    events,
    person,
    person_api,
    sector,
)


@pytest.fixture
def automation(request):
    """An active automation (with its worker) in the ``sector`` fixture."""
    return AutomationWithWorkerFactory(sector=request.getfixturevalue("sector"))
