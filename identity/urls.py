from django.urls import path

from common.urls import member_actions
from identity import schema  # noqa: F401  (the credentials in the OpenAPI schema)
from identity.api import auth, tenants, users

urlpatterns = [
    path("auth/login", auth.LoginApi.as_view(), name="auth-login"),
    path("auth/refresh", auth.RefreshApi.as_view(), name="auth-refresh"),
    path("auth/logout", auth.LogoutApi.as_view(), name="auth-logout"),
    path("me", auth.MeApi.as_view(), name="me"),
    path("tenants", tenants.TenantCollectionApi.as_view(), name="tenant-list"),
    path("tenants/<int:tenant_id>", tenants.TenantDetailApi.as_view(), name="tenant-detail"),
    *member_actions(
        "tenants/<int:tenant_id>", "tenant", {"deactivate": tenants.TenantDeactivateApi}
    ),
    path("users", users.UserCollectionApi.as_view(), name="user-list"),
    path("users/<int:user_id>", users.UserDetailApi.as_view(), name="user-detail"),
    *member_actions("users/<int:user_id>", "user", {"deactivate": users.UserDeactivateApi}),
]
