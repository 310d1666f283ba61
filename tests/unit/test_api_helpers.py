"""api.models' list helpers (error_responses, the paging dependency, page_response), and the
create routes' bodies that are passed whole to their service method."""

from __future__ import annotations

import inspect
from typing import Any

import orjson
import pytest

from flowhook.api.models import ErrorBody, _paging, error_responses, page_response
from flowhook.api.routes.hooks import HookCreate
from flowhook.api.routes.schedules import ScheduleCreate
from flowhook.api.routes.webhooks import EndpointCreate
from flowhook.service.hooks import HookService
from flowhook.service.pagination import Page
from flowhook.service.schedules import ScheduleService
from flowhook.service.webhooks import WebhookService


def test_error_responses() -> None:
    assert error_responses(400, 404) == {400: {"model": ErrorBody}, 404: {"model": ErrorBody}}


def test_paging_defaults_and_values() -> None:
    assert _paging() == {"limit": 20, "cursor": None}
    assert _paging(5, "flw_x") == {"limit": 5, "cursor": "flw_x"}


def test_page_response() -> None:
    answer = page_response(Page(data=[1, 2], next_cursor="c"), lambda n: {"n": n})
    assert orjson.loads(answer.body) == {"data": [{"n": 1}, {"n": 2}], "next_cursor": "c"}
    empty = page_response(Page(data=[], next_cursor=None), lambda n: {"n": n})
    assert orjson.loads(empty.body) == {"data": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("body", "method"),
    [
        (HookCreate, HookService.create),
        (ScheduleCreate, ScheduleService.create),
        (EndpointCreate, WebhookService.create_endpoint),
    ],
)
def test_create_bodies_are_the_keywords_of_their_service_method(body: Any, method: Any) -> None:
    """The create routes pass ``**dict(body)``: each field must be a keyword of the method,
    and each keyword a field (else a default would stand in for what the caller sent)."""
    keywords = {
        name
        for name, p in inspect.signature(method).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert set(body.model_fields) == keywords
