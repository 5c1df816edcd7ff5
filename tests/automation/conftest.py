from __future__ import annotations

import pytest

from tests.automation.factories import AutomationFactory
from tests.sector.conftest import (  # noqa: F401 (fixtures shared with the sector tests)
    admin_api,
    admin_site,
    events,
    person,
    person_api,
    platform_admin,
    sector,
)


@pytest.fixture
def automation(request):
    """An active automation (with its worker) in the ``sector`` fixture."""
    return AutomationFactory(sector=request.getfixturevalue("sector"))
