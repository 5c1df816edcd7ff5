"""Tenants and the people who act for them.

Nobody is deleted: deactivating a tenant or a user is the only way out, and it
keeps every row that points at them (jobs, events) meaningful.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models
from django.db.models.functions import Lower


class Tenant(models.Model):
    """An organization: owns users and jobs; its messages go to ``outbox_messages``."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "tenants"
        ordering = ("name", "id")

    def __str__(self) -> str:
        return self.name


class UserManager(BaseUserManager):
    use_in_migrations = True

    def get_by_natural_key(self, username):
        # Email is the login and is unique regardless of case.
        return self.get(email__iexact=username)

    def _create(self, email: str, password: str | None, **fields) -> User:
        if not email:
            raise ValueError("An email is required")
        user = self.model(email=self.normalize_email(email).strip(), **fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **fields) -> User:
        fields.setdefault("is_staff", False)
        fields.setdefault("is_superuser", False)
        return self._create(email, password, **fields)

    def create_superuser(self, email: str, password: str | None = None, **fields) -> User:
        """A platform admin: Django staff, no tenant."""
        fields["is_staff"] = True
        fields["is_superuser"] = True
        fields["tenant"] = None
        return self._create(email, password, **fields)


class User(AbstractBaseUser, PermissionsMixin):
    """A person. Tenant users have a tenant and a role; platform admins are staff, no tenant."""

    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    id = models.BigAutoField(primary_key=True)
    email = models.EmailField(max_length=254, unique=True)
    full_name = models.CharField(max_length=200, blank=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="users"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deactivated_at = models.DateTimeField(null=True, blank=True)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        db_table = "users"
        ordering = ("email",)
        constraints = [
            models.UniqueConstraint(Lower("email"), name="users_email_ci_key"),
            # Only platform admins (staff) live outside a tenant.
            models.CheckConstraint(
                condition=models.Q(tenant__isnull=False) | models.Q(is_staff=True),
                name="users_tenant_or_staff_check",
            ),
        ]

    def __str__(self) -> str:
        return self.email

    @property
    def is_platform_admin(self) -> bool:
        return self.is_active and self.is_staff
