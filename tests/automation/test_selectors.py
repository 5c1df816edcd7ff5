"""Who sees a retired automation: decided by the selectors, whatever view asks."""

from __future__ import annotations

import pytest

from automation.selectors import automation_for_caller, automation_list, automations_visible_to
from automation.services import automation_deactivate
from common.errors import NotFound
from tests.factories import AutomationWithWorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def automations(platform_admin):
    active = AutomationWithWorkerFactory()
    retired = AutomationWithWorkerFactory()
    automation_deactivate(automation_id=retired.id, actor=platform_admin)
    return active, retired


def test_a_platform_admin_sees_retired_automations_and_everyone_else_only_active_ones(
    automations, platform_admin, user
):
    active, retired = automations

    assert set(automations_visible_to(platform_admin)) == {active, retired}
    assert list(automations_visible_to(user)) == [active]
    assert list(automation_list(caller=user, active=False)) == []
    assert list(automation_list(caller=platform_admin, active=False)) == [retired]


def test_a_retired_automation_is_not_found_for_a_tenant_user(automations, platform_admin, user):
    _, retired = automations

    assert automation_for_caller(caller=platform_admin, automation_id=retired.id) == retired
    with pytest.raises(NotFound):
        automation_for_caller(caller=user, automation_id=retired.id)
