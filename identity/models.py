"""Tenants and the people who act for them.

Nobody is deleted: deactivating a tenant or a user is the only way out, and it
keeps every row that points at them (jobs, events) meaningful.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models
from django.db.models import Q
from django.utils import timezone

from common.models import Deactivatable, Timestamped
from identity.emails import normalize_email


class Tenant(Timestamped, Deactivatable):
    """An organization: owns users and jobs; its messages go to ``outbox_messages``."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)

    inactive_message = "The tenant is deactivated."
    inactive_code = "tenant_inactive"
    already_inactive_message = "The tenant is already deactivated."
    already_inactive_code = "already_inactive"

    class Meta:
        db_table = "tenants"
        ordering = ("name", "id")

    def __str__(self) -> str:
        return self.name

    def rename(self, *, name: str) -> None:
        self.ensure_active(message="A deactivated tenant cannot be renamed.")
        self.name = name


class UserManager(BaseUserManager):
    use_in_migrations = True

    def get_by_natural_key(self, username):
        # Email is the login, stored in its normal form: compared exactly, never by the
        # database's own idea of case.
        return self.get(email=normalize_email(username))

    def _create(self, email: str, password: str | None, **fields) -> User:
        if not email:
            raise ValueError("An email is required")
        user = self.model(email=normalize_email(email), **fields)
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


class User(Timestamped, Deactivatable, AbstractBaseUser, PermissionsMixin):
    """A person. Tenant users have a tenant and a role; platform admins are staff, no tenant."""

    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    id = models.BigAutoField(primary_key=True)
    # Always in its normal form (``identity.emails.normalize_email``, applied by ``save``):
    # the unique index is then uniqueness of the normal form, and lookups compare exactly.
    email = models.EmailField(max_length=254, unique=True)
    full_name = models.CharField(max_length=200, blank=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="users"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    is_staff = models.BooleanField(default=False)

    inactive_message = "A deactivated user cannot be changed."
    inactive_code = "user_inactive"
    already_inactive_message = "The user is already deactivated."
    already_inactive_code = "already_inactive"

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        db_table = "users"
        ordering = ("email",)
        constraints = [
            # Only platform admins (staff) live outside a tenant.
            models.CheckConstraint(
                condition=models.Q(tenant__isnull=False) | models.Q(is_staff=True),
                name="users_tenant_or_staff_check",
            ),
        ]

    def __str__(self) -> str:
        return self.email

    def save(self, *args, **kwargs) -> None:
        # Every way of writing a user (services, admin, createsuperuser, fixtures) stores
        # the normal form, so no path can slip a second spelling of an address in.
        if self.email:
            self.email = normalize_email(self.email)
        super().save(*args, **kwargs)

    @classmethod
    def normalize_username(cls, username):
        return normalize_email(username) if isinstance(username, str) else username

    @property
    def is_platform_admin(self) -> bool:
        """Staff without a tenant: the one rule, for the API and the admin site alike (the
        table's check lets a staff account hold a tenant; such an account is its tenant's
        person, not an admin of every tenant)."""
        return self.is_active and self.is_staff and self.tenant_id is None

    @property
    def may_log_in(self) -> bool:
        """Active, and (for tenant users) of an active tenant."""
        return self.is_active and (self.tenant_id is None or self.tenant.is_active)


class RevokeReason(models.TextChoices):
    LOGOUT = "logout", "Logged out"
    REUSE_DETECTED = "reuse_detected", "A rotated token was presented again"
    USER_DEACTIVATED = "user_deactivated", "The user was deactivated"
    TENANT_DEACTIVATED = "tenant_deactivated", "The tenant was deactivated"
    PASSWORD_CHANGED = "password_changed", "The password was changed"


class RefreshToken(models.Model):
    """One opaque refresh token, stored only as its SHA-256.

    Every login starts a *family*; each refresh marks the presented token used and
    issues its successor in the same family. A used token presented again means
    someone else holds a copy, so the whole family is revoked.
    """

    RevokeReason = RevokeReason

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(User, on_delete=models.PROTECT, related_name="refresh_tokens")
    family = models.UUIDField(default=uuid.uuid4)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    # Set when the token was exchanged for its successor (``replaced_by``).
    used_at = models.DateTimeField(null=True, blank=True)
    replaced_by = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="replaces"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoke_reason = models.CharField(
        max_length=32, choices=RevokeReason.choices, blank=True, default=""
    )

    class Meta:
        db_table = "refresh_tokens"
        constraints = [
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True, revoke_reason="")
                | Q(revoked_at__isnull=False, revoke_reason__in=RevokeReason.values),
                name="refresh_tokens_revoke_reason_check",
            ),
            models.CheckConstraint(
                condition=Q(used_at__isnull=True) | Q(replaced_by__isnull=False),
                name="refresh_tokens_used_has_successor_check",
            ),
        ]
        indexes = [
            # Revoking a family on reuse or logout.
            models.Index(fields=["family"], name="refresh_tokens_family_idx"),
            # Revoking every live token of a user (or a tenant's users) on deactivation.
            models.Index(
                fields=["user"],
                condition=Q(revoked_at__isnull=True),
                name="refresh_tokens_user_live_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"refresh token {self.pk} of user {self.user_id}"

    def is_expired(self, now: datetime) -> bool:
        return self.expires_at <= now
