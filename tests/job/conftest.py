"""Fixtures of the jobs tests: a tenant's person, an automation and its worker."""

from __future__ import annotations

import pytest

from tests.clients import client_of
from tests.factories import AutomationFactory, UserFactory, WorkerFactory
from tests.job.support import worker_client


@pytest.fixture
def automation(db):
    return AutomationFactory()


@pytest.fixture
def worker(automation):
    return WorkerFactory(automation=automation)


@pytest.fixture
def other_worker(db):
    return WorkerFactory()


@pytest.fixture
def person_client(user):
    return client_of(user)


@pytest.fixture
def worker_api(worker):
    return worker_client(worker)


@pytest.fixture
def other_person(other_tenant):
    return UserFactory(tenant=other_tenant)
