"""The plain-ASGI execute path takes only bodies the FastAPI model accepts as they are, and
reads them the same way; everything else goes to the model, which names what is wrong."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flowhook.api.fast import parse_execute
from flowhook.api.models import ExecuteRequest

BODIES = [
    b'{"flow_id": "wf_1", "trigger": "api", "payload": {"n": 1}}',
    b'{"flow_id": "wf_1"}',
    b'{"flow_id": "wf_1", "payload": {}}',
    b'{"flow_id": "wf_1", "payload": {"nested": {"a": [1, 2.5, null, true, "x"]}}}',
    b'{"flow_id": "wf_1", "trigger": "cron"}',  # the service refuses it, on both paths
    b'{"payload": {}, "flow_id": "wf_\\u00e9"}',
    b'{"flow_id": "wf_1", "flow_id": "wf_2"}',
    b"{}",
    b"[]",
    b"null",
    b'"wf_1"',
    b"{not json",
    b"",
    b'{"flow_id": 7}',
    b'{"flow_id": null}',
    b'{"flow_id": "wf_1", "payload": null}',
    b'{"flow_id": "wf_1", "payload": [1]}',
    b'{"flow_id": "wf_1", "payload": "text"}',
    b'{"flow_id": "wf_1", "trigger": 1}',
    b'{"flow_id": "wf_1", "trigger": null}',
    b'{"flow_id": "wf_1", "bogus": 1}',
    b'{"flow_id": true}',
    b'{"flow_id": "wf_1", "payload": {"n": NaN}}',
    b'{"flow_id": "wf_1", "payload": {"n": 123456789012345678901234567890}}',
    b'{"flow_id": "wf_1", "payload": {"n": 18446744073709551615}}',
]


@pytest.mark.parametrize("body", BODIES)
def test_fast_path_agrees_with_the_model(body: bytes) -> None:
    fast = parse_execute(body)
    try:
        model = ExecuteRequest.model_validate_json(body)
    except ValidationError:
        assert fast is None  # the model answers with its 400
        return
    if fast is None:
        return  # declining is always safe: the model then handles the body
    assert fast == (model.flow_id, model.trigger, model.payload)


def test_integers_beyond_64_bits_are_left_to_the_model() -> None:
    # orjson would read them as floats, losing digits the model's parser keeps
    assert (
        parse_execute(b'{"flow_id": "wf_1", "payload": {"n": 123456789012345678901234567890}}')
        is None
    )
    assert parse_execute(b'{"flow_id": "wf_1", "payload": {"n": 9223372036854775807}}') == (
        "wf_1",
        "api",
        {"n": 2**63 - 1},
    )


def test_well_formed_bodies_take_the_fast_path() -> None:
    assert parse_execute(BODIES[0]) == ("wf_1", "api", {"n": 1})
    assert parse_execute(BODIES[1]) == ("wf_1", "api", {})
