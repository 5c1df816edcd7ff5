from django.urls import path

from identity.api import auth, tenants, users

urlpatterns = [
    path("auth/login", auth.LoginApi.as_view(), name="auth-login"),
    path("auth/refresh", auth.RefreshApi.as_view(), name="auth-refresh"),
    path("auth/logout", auth.LogoutApi.as_view(), name="auth-logout"),
    path("me", auth.MeApi.as_view(), name="me"),
    path("tenants", tenants.TenantCollectionApi.as_view(), name="tenant-list"),
    path("tenants/<int:tenant_id>", tenants.TenantDetailApi.as_view(), name="tenant-detail"),
    path(
        "tenants/<int:tenant_id>/deactivate",
        tenants.TenantDeactivateApi.as_view(),
        name="tenant-deactivate",
    ),
    path("users", users.UserCollectionApi.as_view(), name="user-list"),
    path("users/<int:user_id>", users.UserDetailApi.as_view(), name="user-detail"),
    path(
        "users/<int:user_id>/deactivate", users.UserDeactivateApi.as_view(), name="user-deactivate"
    ),
]
