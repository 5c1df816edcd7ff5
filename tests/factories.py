"""factory_boy factories, exposed as fixtures in ``tests/conftest.py``."""

from __future__ import annotations

import factory

from identity.models import Tenant, User

DEFAULT_PASSWORD = "correct-horse-battery-staple-42"


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"person{n}@example.com")
    full_name = factory.Faker("name")
    tenant = factory.SubFactory(TenantFactory)
    role = User.Role.MEMBER

    @factory.post_generation
    def password(self, create, extracted, **kwargs):
        self.set_password(extracted or DEFAULT_PASSWORD)
        if create:
            self.save(update_fields=["password"])


class PlatformAdminFactory(UserFactory):
    tenant = None
    is_staff = True
    is_superuser = True


class ManagerFactory(UserFactory):
    role = User.Role.MANAGER


def bearer(user: User) -> str:
    """An ``Authorization`` header value for ``user``, without going through login."""
    from identity.tokens import issue_access_token

    return f"Bearer {issue_access_token(user).token}"
