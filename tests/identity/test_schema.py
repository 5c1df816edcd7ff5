"""The OpenAPI schema documents every identity endpoint, its bodies and its authentication."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

# (path, method, request body component or None, success status)
OPERATIONS = [
    ("/api/v1/auth/login", "post", "LoginRequest", "200"),
    ("/api/v1/auth/refresh", "post", "RefreshRequest", "200"),
    ("/api/v1/auth/logout", "post", "RefreshRequest", "204"),
    ("/api/v1/me", "get", None, "200"),
    ("/api/v1/tenants", "get", None, "200"),
    ("/api/v1/tenants", "post", "TenantCreateRequest", "201"),
    ("/api/v1/tenants/{tenant_id}", "get", None, "200"),
    ("/api/v1/tenants/{tenant_id}", "patch", "PatchedTenantRenameRequest", "200"),
    ("/api/v1/tenants/{tenant_id}/deactivate", "post", None, "200"),
    ("/api/v1/users", "get", None, "200"),
    ("/api/v1/users", "post", "UserRegisterRequest", "201"),
    ("/api/v1/users/{user_id}", "get", None, "200"),
    ("/api/v1/users/{user_id}", "patch", "PatchedUserUpdateRequest", "200"),
    ("/api/v1/users/{user_id}/deactivate", "post", None, "200"),
]


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    from drf_spectacular.generators import SchemaGenerator

    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


@pytest.mark.parametrize(("path", "method", "request_body", "success"), OPERATIONS)
def test_each_operation_documents_its_bodies(schema, path, method, request_body, success):
    operation = schema["paths"][path][method]

    if request_body:
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith(f"/{request_body}")
    else:
        assert "requestBody" not in operation
    assert success in operation["responses"]
    if success != "204":
        assert operation["responses"][success]["content"]["application/json"]["schema"]


def test_the_session_endpoints_need_no_token(schema):
    assert "security" not in schema  # no scheme applies unless an operation names one
    for path in ("/api/v1/auth/login", "/api/v1/auth/refresh", "/api/v1/auth/logout"):
        assert schema["paths"][path]["post"].get("security", []) in ([], [{}])


def test_the_other_endpoints_name_the_bearer_scheme(schema):
    assert schema["components"]["securitySchemes"]["accessToken"]["scheme"] == "bearer"
    for path, method, _, _ in OPERATIONS:
        if not path.startswith("/api/v1/auth/"):
            assert {"accessToken": []} in schema["paths"][path][method]["security"], path


def test_the_login_failures_are_documented_in_the_error_format(schema):
    responses = schema["paths"]["/api/v1/auth/login"]["post"]["responses"]
    assert {"401", "403", "429"} <= set(responses)
    assert responses["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


def test_lists_are_paginated_in_the_schema(schema):
    listed = schema["paths"]["/api/v1/users"]["get"]["responses"]["200"]["content"]
    assert listed["application/json"]["schema"]["$ref"].endswith("/PaginatedUserList")
