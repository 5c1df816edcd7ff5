"""Every failure leaves the API in one format: {"error": {"code", "message", "details"}}."""

import pytest
from rest_framework.test import APIClient

pytestmark = [pytest.mark.urls("tests.common.urls"), pytest.mark.django_db]


@pytest.fixture
def api():
    return APIClient(raise_request_exception=False)


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def test_validation_errors_carry_their_fields(api):
    error = assert_error(
        api.post("/t/validate", {"name": "toolong", "count": 0}, format="json"), 400, "invalid"
    )
    assert set(error["details"]) == {"name", "count"}


def test_malformed_json_is_a_400_not_a_500(api):
    response = api.post("/t/validate", "{not json", content_type="application/json")
    assert_error(response, 400, "malformed_request")


def test_domain_errors_keep_their_code_and_details(api):
    error = assert_error(api.post("/t/conflict"), 409, "not_pending")
    assert error["details"] == {"status": "running"}


def test_unexpected_errors_are_a_500_in_the_same_format(api):
    assert_error(api.get("/t/crash"), 500, "internal_error")


def test_unauthenticated_requests_get_401(api):
    response = api.get("/t/private")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_garbage_token_is_refused(api):
    api.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    assert_error(api.get("/t/private"), 401, "invalid_token")


def test_wrong_method_is_a_405(api):
    assert_error(api.get("/t/conflict"), 405, "method_not_allowed")


def test_unknown_paths_are_a_404_in_the_same_format(api):
    assert_error(api.get("/api/v1/no-such-thing"), 404, "not_found")
    assert_error(api.get("/nowhere"), 404, "not_found")


def test_every_response_carries_a_request_id(api):
    response = api.get("/health/live", HTTP_X_REQUEST_ID="abc-123")
    assert response["X-Request-ID"] == "abc-123"
    assert api.get("/health/live")["X-Request-ID"]


def test_json_nested_too_deeply_is_a_400_not_a_500(api):
    response = api.post("/t/validate", "[" * 100_000, content_type="application/json")
    assert_error(response, 400, "malformed_request")


def test_a_body_over_the_size_limit_is_a_413_in_the_error_format(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000
    body = '{"name": "' + "x" * 2_000 + '", "count": 1}'
    assert_error(api.post("/t/validate", body, content_type="application/json"), 413, "too_large")


def test_json_nested_deep_enough_to_break_encoding_is_refused_at_the_door(api):
    # Parses, but would fail with RecursionError wherever it is encoded again.
    deep = "[" * 900 + "]" * 900
    response = api.post("/t/validate", deep, content_type="application/json")
    assert_error(response, 400, "malformed_request")


def test_json_nested_a_few_levels_is_parsed(api):
    nested = {"name": "ok", "count": 1, "extra": [[[{"a": {"b": [1]}}]]]}
    assert api.post("/t/validate", nested, format="json").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "a", "count": 1, "name": "b"}',
        '{"name": "a", "count": 1, "extra": [{"k": 1, "k": 1}]}',
    ],
)
def test_a_key_given_twice_is_a_400_naming_it_not_its_last_value_taken(api, body):
    error = assert_error(
        api.post("/t/validate", body, content_type="application/json"), 400, "malformed_request"
    )
    assert "given more than once" in error["message"]
    assert ("'name'" if '"name": "b"' in body else "'k'") in error["message"]
