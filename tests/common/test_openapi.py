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
