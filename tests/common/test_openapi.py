"""The OpenAPI schema is generated from the code, validates, and has no warnings."""

import pytest
import yaml
from django.core.management import call_command


@pytest.mark.django_db
def test_the_schema_validates_without_warnings_and_names_both_auth_schemes(tmp_path):
    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))

    schema = yaml.safe_load(target.read_text())
    assert set(schema["components"]["securitySchemes"]) == {"accessToken", "workerCredential"}
    operations = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {"jobs_start", "worker_me", "worker_jobs_pending"} <= operations


@pytest.fixture(scope="module")
def schema():
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def test_every_error_answer_is_documented_in_the_error_format(schema):
    for method, path, operation in operations(schema):
        for code, response in operation["responses"].items():
            if int(code) >= 400:
                content = response.get("content", {}).get("application/json", {})
                assert content.get("schema") == {"$ref": "#/components/schemas/Error"}, (
                    method,
                    path,
                    code,
                )
                assert response["description"], (method, path, code)


@pytest.mark.parametrize(
    "method, path, codes",
    [
        # Body, authentication, a permission that refuses some people, domain conflicts.
        ("POST", "/api/v1/jobs", {"400", "401", "403", "409", "413", "415"}),
        # Query filters, no body.
        ("GET", "/api/v1/jobs", {"400", "401", "403"}),
        ("GET", "/api/v1/jobs/{job_id}", {"401", "403", "404"}),
        # Query filters and a cursor; managers and platform admins only.
        ("GET", "/api/v1/events", {"400", "401", "403"}),
        # No body; the refusals of POST /jobs, and a job to find.
        ("POST", "/api/v1/jobs/{job_id}/rerun", {"400", "401", "403", "404", "409"}),
        # Throttled, and no authentication to fail.
        ("POST", "/api/v1/auth/login", {"400", "401", "403", "413", "415", "429"}),
        # Any person may: no 403; nothing to look up: no 404; no input: no 400.
        ("GET", "/api/v1/me", {"401"}),
        ("GET", "/api/v1/worker/me", {"401"}),
        # An optional body (the worker's name for its claim).
        ("POST", "/api/v1/jobs/{job_id}/start", {"400", "401", "404", "409", "413", "415"}),
        ("POST", "/api/v1/jobs/{job_id}/heartbeat", {"400", "401", "404", "409", "413", "415"}),
        ("GET", "/api/v1/worker/jobs", {"400", "401"}),
        # One path, two callers: the worker sends its command's output, people read it.
        ("POST", "/api/v1/jobs/{job_id}/output", {"400", "401", "404", "409", "413", "415"}),
        ("GET", "/api/v1/jobs/{job_id}/output", {"400", "401", "403", "404"}),
        ("DELETE", "/api/v1/sectors/{sector_id}", {"401", "403", "404", "405"}),
        ("PATCH", "/api/v1/users/{user_id}", {"400", "401", "403", "404", "409", "413", "415"}),
    ],
)
def test_each_operation_documents_the_errors_it_can_answer(schema, method, path, codes):
    operation = schema["paths"][path][method.lower()]
    documented = {code for code in operation["responses"] if int(code) >= 400}
    assert documented == codes


def test_what_is_always_an_object_or_may_be_null_is_documented_so(schema):
    components = schema["components"]["schemas"]
    for component in ("JobOutput", "ClaimedJobOutput", "JobCreateInputRequest"):
        assert components[component]["properties"]["params"]["type"] == "object", component
    job = components["JobOutput"]["properties"]
    assert job["failure_reason"]["nullable"] is True
    for nullable in ("requested_by", "rerun_of", "result", "progress", "exit_code", "started_at"):
        assert job[nullable]["nullable"] is True, nullable
