"""Identity use cases: tenants, users and their sessions (token pairs).

Each service is the transaction boundary of its change and records the domain
event of that change through the outbox in the same transaction: tenant events
on the platform outbox, user events on their tenant's outbox.

Rows are locked in one order, the tenant, then the user, then refresh tokens, and a row
whose key does not change is locked ``FOR NO KEY UPDATE``, which the foreign-key checks
of the rows written beside it (a user's event on its tenant's outbox, a new refresh token
of the user) do not wait for. A token is issued (``_hold_for_issuing``) with its tenant
held ``FOR SHARE`` and its user ``FOR NO KEY UPDATE``, both checked active under those
locks: a deactivation of either (or a new password) waits for the token's transaction,
then revokes it with the others, or goes first and the token is refused.
"""

from __future__ import annotations

import functools
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.hashers import check_password, make_password
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.text import slugify

from common.errors import Conflict, DomainError, Forbidden, InvalidInput
from common.models import save_or_refuse
from identity.emails import normalize_email
from identity.models import RefreshToken, RevokeReason, Tenant, User
from identity.tokens import (
    access_token_id,
    hash_refresh_token,
    issue_access_token,
    new_refresh_token,
    successor_refresh_token,
)
from outbox.services import publish

logger = logging.getLogger("hubdommed.identity")


class Unauthenticated(DomainError):
    """A credential refused at login or refresh: the caller is nobody we know (401)."""

    status_code = 401


class InvalidCredentials(Unauthenticated):
    code = "invalid_credentials"
    default_message = "The email or the password is incorrect."


class InvalidRefreshToken(Unauthenticated):
    code = "invalid_refresh_token"
    default_message = "The refresh token is not valid."


class AccountInactive(Forbidden):
    code = "account_inactive"
    default_message = "This account is deactivated."


@dataclass(frozen=True)
class TokenPair:
    user: User
    access_token: str
    access_token_expires_at: datetime
    refresh_token: str
    refresh_token_expires_at: datetime


# --- Tenants ------------------------------------------------------------------------------

# Tries at a slug derived from the name, each lost to a tenant created at the same moment.
DERIVED_SLUG_ATTEMPTS = 10


@transaction.atomic
def tenant_create(*, name: str, slug: str | None = None, actor: User) -> Tenant:
    name = name.strip()
    if not name:
        raise InvalidInput(details={"name": ["A name is required."]})
    # A slug derived from the name is derived again when a tenant created at the same
    # moment took it (both saw it free): the caller chose no slug, so none is "taken" for
    # them. A few times at most; a chosen slug is tried once.
    for _attempt in range(1 if slug else DERIVED_SLUG_ATTEMPTS):
        tenant = Tenant(name=name, slug=slug or _free_slug(name))
        try:
            with transaction.atomic():
                tenant.save()
            break
        except IntegrityError:
            continue
    else:
        raise Conflict(
            "Another tenant already uses this slug.",
            code="slug_taken",
            details={"slug": tenant.slug},
        )
    publish(
        "TenantCreated",
        {"tenant_id": tenant.pk, "name": tenant.name, "slug": tenant.slug},
        tenant=None,
        aggregate=tenant,
        actor=actor,
    )
    return tenant


@transaction.atomic
def tenant_rename(*, tenant: Tenant, name: str, actor: User) -> Tenant:
    tenant = Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
    tenant.rename(name=name.strip())
    tenant.save(update_fields=["name", "updated_at"])
    logger.info("tenant %s renamed by %s", tenant.pk, actor.pk)
    return tenant


@transaction.atomic
def tenant_deactivate(*, tenant: Tenant, actor: User) -> Tenant:
    """Blocks every login of the tenant's users and ends their sessions."""
    # The row lock also orders this against a registration into the same tenant and a
    # token being issued (both hold it FOR SHARE).
    tenant = Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
    now = timezone.now()
    tenant.deactivate(now=now)
    tenant.save(update_fields=["is_active", "deactivated_at", "updated_at"])
    _revoke(RefreshToken.objects.filter(user__tenant=tenant), RevokeReason.TENANT_DEACTIVATED, now)
    publish(
        "TenantDeactivated", {"tenant_id": tenant.pk}, tenant=None, aggregate=tenant, actor=actor
    )
    return tenant


def _free_slug(name: str) -> str:
    base = slugify(name)[:90] or "tenant"
    slug, n = base, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


# --- Users --------------------------------------------------------------------------------


@transaction.atomic
def user_register(
    *,
    tenant: Tenant,
    email: str,
    password: str,
    full_name: str = "",
    role: str = User.Role.MEMBER,
    actor: User,
) -> User:
    # Held to the commit: a deactivation of the tenant waits for the new user, then ends it.
    tenant = _tenant_shared(tenant.pk)
    tenant.ensure_active()
    email = normalize_email(email)
    user = User(email=email, full_name=full_name.strip(), tenant=tenant, role=role)
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        raise InvalidInput(details={"password": exc.messages}) from None
    if User.objects.filter(email=email).exists():
        raise _email_taken()
    user.set_password(password)
    # Registered by someone else a moment ago: the unique index has the last word.
    save_or_refuse(user, lambda _constraint: _email_taken())
    publish(
        "UserRegistered",
        {"user_id": user.pk, "tenant_id": tenant.pk, "role": user.role},
        tenant=tenant,
        aggregate=user,
        actor=actor,
    )
    return user


@transaction.atomic
def user_update(
    *, user: User, full_name: str | None = None, role: str | None = None, actor: User
) -> User:
    user = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    user.ensure_active()
    fields = []
    if full_name is not None:
        user.full_name = full_name.strip()
        fields.append("full_name")
    if role is not None:
        if role not in User.Role.values:
            raise InvalidInput(details={"role": [f"'{role}' is not a role."]})
        user.role = role
        fields.append("role")
    if fields:
        user.save(update_fields=[*fields, "updated_at"])
        logger.info("user %s updated (%s) by %s", user.pk, ", ".join(fields), actor.pk)
    return user


@transaction.atomic
def user_deactivate(*, user: User, actor: User) -> User:
    """Blocks the user's login and ends every session; nothing is deleted."""
    if actor.pk == user.pk:
        raise Conflict("You cannot deactivate yourself.", code="cannot_deactivate_self")
    user = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    now = timezone.now()
    user.deactivate(now=now)
    user.save(update_fields=["is_active", "deactivated_at", "updated_at"])
    _revoke(RefreshToken.objects.filter(user=user), RevokeReason.USER_DEACTIVATED, now)
    publish(
        "UserDeactivated",
        {"user_id": user.pk, "tenant_id": user.tenant_id},
        # Platform admins have no tenant: their events go to the platform outbox.
        tenant=user.tenant_id,
        aggregate=user,
        actor=actor,
    )
    return user


@transaction.atomic
def user_set_password(*, user: User, password: str) -> User:
    """Give the user a new password (the validators apply) and end every session they had."""
    user = User.objects.select_for_update(no_key=True).get(pk=user.pk)
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        raise InvalidInput(details={"password": exc.messages}) from None
    user.set_password(password)
    user.save(update_fields=["password", "updated_at"])
    _revoke(RefreshToken.objects.filter(user=user), RevokeReason.PASSWORD_CHANGED, timezone.now())
    return user


def _email_taken() -> Conflict:
    return Conflict.over_field(
        "email", "A user with this email already exists.", code="email_taken"
    )


# --- Sessions: login, refresh, logout -----------------------------------------------------


def user_login(*, email: str, password: str) -> TokenPair:
    """A new token pair for the right email and password; starts a refresh-token family.

    An unknown email and a wrong password give the same error after the same work
    (one password hash check), so neither the answer nor its timing tells them apart.
    """
    user = User.objects.select_related("tenant").filter(email=normalize_email(email)).first()
    if user is None:
        check_password(password, _dummy_password_hash())
        raise InvalidCredentials()
    if not user.check_password(password):
        raise InvalidCredentials()
    # Only someone who knows the password learns that the account is closed.
    _refuse_inactive(user)
    with transaction.atomic():
        # Checked again under the locks: a deactivation may have committed meanwhile.
        user = _hold_for_issuing(user)
        _refuse_inactive(user)
        now = timezone.now()
        refresh, row = _new_refresh_token(user=user, family=None, now=now)
        user.last_login = now
        user.save(update_fields=["last_login"])
    logger.info("user %s logged in (session %s)", user.pk, row.family)
    return _pair(user, refresh, row)


def refresh_token_rotate(*, token: str) -> TokenPair:
    """Exchange a refresh token for a new pair; the presented token stops working.

    A token that was already exchanged is a stolen copy (or the victim's, after the
    thief used it first): the whole family is revoked, the newest token included.
    Except within ``REFRESH_REUSE_GRACE_SECONDS`` of its exchange while its successor
    is still unused: that is two clients of one session refreshing at once (the row
    lock makes them take turns), and the later ones get the same successor pair again
    instead of ending the session. Successors are derived from the token they replace
    (``successor_refresh_token``), so they can be given again with only hashes stored.

    Not wrapped in ``transaction.atomic`` as a whole: the revocation of a family
    must commit even though the call then fails.
    """
    digest = hash_refresh_token(token)
    reused_family = None
    successor = None
    holder = RefreshToken.objects.select_related("user").filter(token_hash=digest).first()
    # Found by its hash; compared again in constant time all the same.
    if holder is None or not hmac.compare_digest(holder.token_hash, digest):
        raise InvalidRefreshToken()
    with transaction.atomic():
        # The tenant and the user first, then the token (the module's lock order).
        _hold_for_issuing(holder.user)
        current = (
            RefreshToken.objects.select_for_update(of=("self",))
            .select_related("user__tenant")
            .filter(pk=holder.pk)
            .first()
        )
        if current is None:
            raise InvalidRefreshToken()
        now = timezone.now()
        if current.revoked_at is not None:
            raise InvalidRefreshToken()
        if current.used_at is not None:
            successor = _successor_within_grace(current, token=token, now=now)
            if successor is not None:
                logger.info(
                    "refresh within the grace window: session %s of user %s",
                    current.family,
                    current.user_id,
                )
                refresh = successor_refresh_token(token)
            else:
                _revoke(
                    RefreshToken.objects.filter(family=current.family),
                    RevokeReason.REUSE_DETECTED,
                    now,
                )
                reused_family = current.family
        elif current.is_expired(now):
            raise InvalidRefreshToken(
                "The refresh token has expired.", code="refresh_token_expired"
            )
        elif not current.user.may_log_in:
            raise AccountInactive()
        else:
            refresh, successor = _new_refresh_token(
                user=current.user, family=current.family, now=now, parent=token
            )
            current.used_at = now
            current.replaced_by = successor
            current.save(update_fields=["used_at", "replaced_by"])
    if reused_family is not None:
        logger.warning(
            "refresh token reused: session %s of user %s revoked", reused_family, current.user_id
        )
        raise InvalidRefreshToken(
            "The refresh token was already used; the session it belongs to has been ended.",
            code="refresh_token_reused",
        )
    return _pair(current.user, refresh, successor)


@transaction.atomic
def refresh_token_revoke(*, token: str) -> None:
    """Logout: ends the session (family) of the token. Unknown tokens are ignored."""
    digest = hash_refresh_token(token)
    current = RefreshToken.objects.select_related("user").filter(token_hash=digest).first()
    if current is None or not hmac.compare_digest(current.token_hash, digest):
        return
    # The user held as every issuing holds it (the module's lock order): a login or a
    # refresh under way is waited for, and the family is read after it committed, its new
    # token included. Holding the presented token alone missed a refresh of another token
    # of the family (a newer one), whose successor the revocation's snapshot did not see.
    _hold_for_issuing(current.user)
    _revoke(RefreshToken.objects.filter(family=current.family), RevokeReason.LOGOUT, timezone.now())
    logger.info("user %s logged out (session %s)", current.user_id, current.family)


def _successor_within_grace(current: RefreshToken, *, token: str, now: datetime):
    """The successor ``current`` was exchanged for, when it may be handed out again."""
    grace = timedelta(seconds=settings.REFRESH_REUSE_GRACE_SECONDS)
    if not grace or now - current.used_at > grace:
        return None
    successor = RefreshToken.objects.filter(pk=current.replaced_by_id).first()
    if (
        successor is None
        or successor.used_at is not None  # the chain moved on: not a racing twin
        or successor.revoked_at is not None
        or successor.is_expired(now)
        or not current.user.may_log_in
    ):
        return None
    # Successors are derived from their parent: tokens issued before that was so were
    # random and cannot be given again.
    expected = hash_refresh_token(successor_refresh_token(token))
    if not hmac.compare_digest(successor.token_hash, expected):
        return None
    return successor


def _new_refresh_token(
    *, user: User, family, now: datetime, parent: str | None = None
) -> tuple[str, RefreshToken]:
    token = successor_refresh_token(parent) if parent is not None else new_refresh_token()
    row = RefreshToken(
        user=user,
        token_hash=hash_refresh_token(token),
        created_at=now,
        expires_at=now + settings.REFRESH_TOKEN_LIFETIME,
    )
    if family is not None:
        row.family = family
    row.save()
    return token, row


def _pair(user: User, refresh: str, row: RefreshToken) -> TokenPair:
    # Derived from the refresh token's row: giving the same successor again (within the
    # grace window) gives the same access token with it, not a third pair.
    access = issue_access_token(user, issued_at=row.created_at, jti=access_token_id(row.token_hash))
    return TokenPair(
        user=user,
        access_token=access.token,
        access_token_expires_at=access.expires_at,
        refresh_token=refresh,
        refresh_token_expires_at=row.expires_at,
    )


def _refuse_inactive(user: User) -> None:
    if not user.is_active:
        raise AccountInactive()
    if user.tenant_id is not None and not user.tenant.is_active:
        raise AccountInactive("The organization of this account is deactivated.")


def _hold_for_issuing(user: User) -> User:
    """The user, read again with its tenant held ``FOR SHARE`` and itself ``FOR NO KEY
    UPDATE`` to the end of the transaction: a token issued under these locks, once the
    caller checked the user active as read here, is seen by any deactivation (or new
    password) that commits after it."""
    if user.tenant_id is not None:
        _tenant_shared(user.tenant_id)
    held = User.objects.select_for_update(no_key=True, of=("self",))
    return held.select_related("tenant").get(pk=user.pk)


def _tenant_shared(tenant_id: int) -> Tenant:
    """The tenant, held ``FOR SHARE`` to the end of the transaction: its deactivation (and
    rename) wait for it, the rows written for it do not."""
    return Tenant.objects.raw("SELECT * FROM tenants WHERE id = %s FOR SHARE", [tenant_id])[0]


def _revoke(tokens: QuerySet[RefreshToken], reason: str, now: datetime) -> int:
    return tokens.filter(revoked_at__isnull=True).update(revoked_at=now, revoke_reason=reason)


@functools.cache
def _dummy_password_hash() -> str:
    # Hashed with the current hasher and its current cost, like a real user's password.
    return make_password(secrets.token_urlsafe(16))
