from __future__ import annotations

from flowhook import errors
from flowhook.api.errors import STATUS, describe_validation_error, status_of


def test_every_domain_error_has_a_status() -> None:
    assert status_of(errors.InvalidDefinition("x")) == 400
    assert status_of(errors.IdempotencyConflict("x")) == 409
    assert status_of(errors.StoreUnavailable("x")) == 503
    assert status_of(errors.FlowhookError("x")) == 500
    assert set(STATUS.values()) == {400, 401, 403, 404, 409, 413, 415, 429, 503}


def test_validation_errors_name_the_field() -> None:
    assert (
        describe_validation_error({"type": "missing", "loc": ("body", "flow_id")})[0]
        == "flow_id is required"
    )
    assert (
        describe_validation_error({"type": "dict_type", "loc": ("body", "payload")})[0]
        == "payload must be a JSON object"
    )
    msg, code, _ = describe_validation_error(
        {"type": "json_invalid", "loc": ("body", 3), "ctx": {"error": "Expecting value"}}
    )
    assert (msg, code) == ("malformed JSON in the request body: Expecting value", "malformed_json")
    assert (
        describe_validation_error({"type": "int_parsing", "loc": ("query", "limit")})[0]
        == "query parameter limit must be an integer"
    )
