"""Schemathesis against the served OpenAPI document, with non-ASCII header values, for the
operations that read headers: no such input makes the API answer 5xx. (Every operation, with
every check, is tests/e2e/test_openapi_contract.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from flowhook.app import create_app
from flowhook.config import Settings
from tests.support import Server, serve

pytestmark = pytest.mark.e2e

# Header values from all of Latin-1 (what HTTP carries beyond ASCII), for the operations that
# take headers: the execute's Idempotency-Key and the inbound hook's signature headers.
latin1 = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
latin1.config.generation.update(codec="latin-1")
latin1 = latin1.include(path_regex=r"^/api/v1/(flows/execute|hooks/\{hook_id\})$", method="POST")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cwd: Path = tmp_path_factory.mktemp("fuzz")
    with serve(cwd, f"sqlite:///{cwd / 'fuzz.db'}", FLOWHOOK_LOG_LEVEL="warning") as s:
        yield s


@pytest.fixture(scope="module")
def hook_ids(server: Server) -> list[str]:
    """Real hooks, one per kind of verification, for the generated deliveries to reach."""
    auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
    flow_id = server.value("example flow")
    made = []
    for verify in ({"type": "hmac"}, {"type": "standard"}, None):
        r = httpx.post(
            f"{server.base}/api/v1/hooks",
            json={"flow_id": flow_id, "verify": verify},
            headers=auth,
        )
        r.raise_for_status()
        made.append(str(r.json()["id"]))
    return made


@latin1.parametrize()
@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_non_ascii_headers_give_no_server_error(
    case: schemathesis.Case, server: Server, hook_ids: list[str]
) -> None:
    if case.path_parameters and "hook_id" in case.path_parameters:
        # Mostly real hooks, so the signature checks run; now and then a generated id.
        pick = sum(map(ord, str(case.headers))) % (len(hook_ids) + 1)
        if pick < len(hook_ids):
            case.path_parameters["hook_id"] = hook_ids[pick]
    key = server.value("sandbox key")
    response = case.call(base_url=server.base, headers={"Authorization": f"Bearer {key}"})
    _check(case, response)


def _check(case: schemathesis.Case, response: schemathesis.Response) -> None:
    assert response.status_code < 500, (case.method, case.path, case.headers, response.text)
    if response.status_code == 400 and response.text == "Invalid HTTP request received.":
        return  # refused by the HTTP parser (e.g. a control character in the path): never reached the app
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body.get("error"), str) and isinstance(body.get("code"), str), body
