"""Request validation and response shapes of the identity API (no business rules here)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api import PartialUpdate, WholeNumberField
from identity.emails import normalize_email
from identity.models import Tenant, User

# --- Sessions -----------------------------------------------------------------------------


class LoginSerializer(serializers.Serializer):
    email = serializers.CharField(max_length=254, trim_whitespace=True)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, write_only=True)


class RefreshSerializer(serializers.Serializer):
    refresh_token = serializers.CharField(max_length=200, trim_whitespace=True, write_only=True)


class TokenPairSerializer(serializers.Serializer):
    token_type = serializers.CharField(default="Bearer")
    access_token = serializers.CharField(help_text="Send as `Authorization: Bearer <token>`.")
    access_token_expires_at = serializers.DateTimeField()
    expires_in = serializers.IntegerField(help_text="Seconds until the access token expires.")
    refresh_token = serializers.CharField(
        help_text="Opaque; exchange it at /auth/refresh. Each one works once."
    )
    refresh_token_expires_at = serializers.DateTimeField()


# --- Tenants ------------------------------------------------------------------------------


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ("id", "name", "slug", "is_active", "created_at", "deactivated_at")
        read_only_fields = fields


class TenantCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(
        max_length=100, required=False, help_text="Derived from the name when omitted."
    )


class TenantRenameSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)


class TenantListQuerySerializer(serializers.Serializer):
    is_active = serializers.BooleanField(required=False, allow_null=True, default=None)
    search = serializers.CharField(required=False, max_length=200, default="")


# --- Users --------------------------------------------------------------------------------


class TenantSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ("id", "name", "slug", "is_active")
        read_only_fields = fields


class UserSerializer(serializers.ModelSerializer):
    class Meta:
        model = User
        fields = (
            "id",
            "email",
            "full_name",
            "tenant",
            "role",
            "is_active",
            "created_at",
            "deactivated_at",
        )
        read_only_fields = fields


class MeSerializer(serializers.ModelSerializer):
    tenant = TenantSummarySerializer(allow_null=True, read_only=True)
    role = serializers.SerializerMethodField(help_text="Null for platform admins (no tenant).")
    is_platform_admin = serializers.BooleanField(read_only=True)

    @extend_schema_field(
        serializers.ChoiceField(choices=User.Role.choices, allow_null=True, read_only=True)
    )
    def get_role(self, user: User) -> str | None:
        return user.role if user.tenant_id is not None else None

    class Meta:
        model = User
        fields = ("id", "email", "full_name", "tenant", "role", "is_platform_admin", "last_login")
        read_only_fields = fields


class NormalizedEmailField(serializers.EmailField):
    """An email checked in the normal form it is stored and compared in."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            data = normalize_email(data)
        return super().to_internal_value(data)


class UserRegisterSerializer(serializers.Serializer):
    email = NormalizedEmailField(max_length=254)
    full_name = serializers.CharField(max_length=200, required=False, default="")
    password = serializers.CharField(max_length=4096, trim_whitespace=False, write_only=True)
    role = serializers.ChoiceField(choices=User.Role.choices, default=User.Role.MEMBER)
    tenant = WholeNumberField(
        required=False,
        min_value=1,
        help_text="Required for platform admins; a manager registers into their own tenant.",
    )


class UserUpdateSerializer(PartialUpdate):
    full_name = serializers.CharField(max_length=200, required=False)
    role = serializers.ChoiceField(choices=User.Role.choices, required=False)


class UserListQuerySerializer(serializers.Serializer):
    is_active = serializers.BooleanField(required=False, allow_null=True, default=None)
    search = serializers.CharField(
        required=False, max_length=200, default="", help_text="Part of the name or email."
    )
    tenant = WholeNumberField(
        required=False, min_value=1, help_text="Platform admins: only this tenant's users."
    )
