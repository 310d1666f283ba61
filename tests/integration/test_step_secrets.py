"""Step secrets (``{{ secrets.NAME }}``), on SQLite and PostgreSQL, against real parts: the
API (values in, names out), an http step that sends one to a real receiver which echoes it
back, what is stored and shown instead of it (``[secret:NAME]``) on every surface, the
refusals at save, a secret deleted since (error type ``secret``) and rotation of the key."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from aiohttp import web
from typer.testing import CliRunner

from flowhook.cli import app as cli
from flowhook.service import Services
from flowhook.store import step_secrets as store
from flowhook.store.crypto import PREFIX, generate_key
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import metadata, step_secrets
from flowhook.web.pages import COOKIE
from tests.conftest import Api, Receiver
from tests.integration.test_webhooks import endpoint, until

VALUE = "sk_live_51Hx9QsuperSECRETvalue"
SHOWN = "[secret:STRIPE_KEY]"


def charge(url: str) -> dict[str, Any]:
    return {
        "name": "charge",
        "steps": [
            {
                "id": "call",
                "type": "http",
                "request": {
                    "method": "POST",
                    "url": url,
                    "headers": {"Authorization": "Bearer {{ secrets.STRIPE_KEY }}"},
                    "json": {"amount": "{{ payload.amount }}", "key": "{{ secrets.STRIPE_KEY }}"},
                },
            }
        ],
        "output": {"echoed": "{{ steps.call.output }}"},
    }


def echo(receiver: Receiver) -> None:
    """The receiver answers each request with its headers and body (an answer that echoes
    the secret back), and records it."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        receiver.requests.append(
            {"headers": dict(request.headers), "body": body, "path": request.path}
        )
        if request.headers.get("X-Service-Event"):  # a webhook delivery
            return web.json_response({"ok": True})
        return web.json_response({"headers": dict(request.headers), "body": body.decode()})

    receiver.handle = handle  # type: ignore[method-assign]


async def add(api: Api, name: str, value: str, who: str = "test") -> Any:
    return await api.post("/api/v1/secrets", {"name": name, "value": value}, who=who)


# -- the API ----------------------------------------------------------------------------------


async def test_the_api_takes_values_and_gives_back_names_only(api: Api, db: Database) -> None:
    r = await add(api, "STRIPE_KEY", VALUE)
    assert r.status_code == 201, r.text
    assert set(r.json()) == {"name", "created_at", "updated_at"}
    again = await add(api, "STRIPE_KEY", "other")
    assert again.status_code == 409, again.text
    assert VALUE not in again.text

    for bad in ("stripe_key", "1KEY", "A" * 65, "KEY-1", ""):
        r = await add(api, bad, "x")
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"].startswith("name "), r.text
    r = await add(api, "EMPTY", "")
    assert r.status_code == 400 and "value" in r.text
    # A refusal never echoes the value it was given.
    for body in (
        {"name": "bad name", "value": VALUE},
        {"name": "LONG", "value": VALUE * 400},
        {"name": "X", "value": VALUE, "extra": VALUE},
        {"name": VALUE, "value": 1},
    ):
        r = await api.post("/api/v1/secrets", body)
        assert r.status_code == 400, r.text
        assert VALUE not in r.text, r.text
    r = await api.client.put("/api/v1/secrets/NOPE", json={"value": VALUE}, headers=api.auth())
    assert r.status_code == 404 and VALUE not in r.text

    listed = (await api.get("/api/v1/secrets")).json()["data"]
    assert [s["name"] for s in listed] == ["STRIPE_KEY"]
    assert set(listed[0]) == {"name", "created_at", "updated_at"}

    r = await api.client.put("/api/v1/secrets/STRIPE_KEY", json={"value": "new-value-1"},
                             headers=api.auth())  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["updated_at"] >= r.json()["created_at"]
    assert "new-value-1" not in r.text

    async with db.read() as conn:
        stored = (await conn.execute(sa.select(step_secrets.c.value))).scalars().all()
    assert len(stored) == 1 and stored[0].startswith(PREFIX) and "new-value-1" not in stored[0]

    # Another workspace, and the other mode of this one, see none of it.
    for who in ("other", "live"):
        assert (await api.get("/api/v1/secrets", who=who)).json()["data"] == []
        r = await api.client.put("/api/v1/secrets/STRIPE_KEY", json={"value": "x"},
                                 headers=api.auth(who))  # fmt: skip
        assert r.status_code == 404, r.text
        r = await api.client.delete("/api/v1/secrets/STRIPE_KEY", headers=api.auth(who))
        assert r.status_code == 404, r.text
    assert (await add(api, "STRIPE_KEY", "live one", who="live")).status_code == 201

    r = await api.client.delete("/api/v1/secrets/STRIPE_KEY", headers=api.auth())
    assert r.status_code == 204, r.text
    assert (await api.get("/api/v1/secrets")).json()["data"] == []
    r = await api.client.delete("/api/v1/secrets/STRIPE_KEY", headers=api.auth())
    assert r.status_code == 404
    assert [s["name"] for s in (await api.get("/api/v1/secrets", who="live")).json()["data"]] == [
        "STRIPE_KEY"
    ]


# -- refused at save --------------------------------------------------------------------------


async def _refused(api: Api, definition: dict[str, Any]) -> dict[str, Any]:
    r = await api.post("/api/v1/flows", definition)
    assert r.status_code == 400, r.text
    body = r.json()
    [problem] = body.get("errors") or [{"message": body["error"], "field": None}]
    return dict(problem)


async def test_a_secret_is_refused_at_save_where_it_would_be_stored_or_is_unknown(
    api: Api,
) -> None:
    assert (await add(api, "STRIPE_KEY", VALUE)).status_code == 201
    unknown = await _refused(api, charge("http://127.0.0.1:9/x") | {"steps": [{
        "id": "call", "type": "http",
        "request": {"url": "http://127.0.0.1:9/x", "headers": {"X-K": "{{ secrets.NOPE }}"}},
    }]})  # fmt: skip
    assert "secrets.NOPE" in unknown["message"] and "step 'call'" in unknown["message"]
    assert unknown["field"] == "definition.steps[0].request.headers"

    task = await _refused(api, {"name": "t", "steps": [
        {"id": "t", "type": "task", "task": "x.y", "input": {"k": "{{ secrets.STRIPE_KEY }}"}},
    ]})  # fmt: skip
    assert task["field"] == "definition.steps[0].input", task
    assert "step 't'" in task["message"] and "task's input" in task["message"]

    transform = await _refused(api, {"name": "t", "steps": [
        {"id": "x", "type": "transform", "output": {"k": "{{ secrets.STRIPE_KEY }}"}},
    ]})  # fmt: skip
    assert transform["field"] == "definition.steps[0].output", transform

    query = await _refused(api, {"name": "t", "steps": [{
        "id": "call", "type": "http",
        "request": {"url": "http://127.0.0.1:9/x", "query": {"k": "{{ secrets.STRIPE_KEY }}"}},
    }]})  # fmt: skip
    assert query["field"] == "definition.steps[0].request.query", query

    whole = await _refused(api, {"name": "t", "steps": [{
        "id": "call", "type": "http",
        "request": {"url": "http://127.0.0.1:9/x", "json": "{{ secrets }}"},
    }]})  # fmt: skip
    assert whole["field"] == "definition.steps[0].request.json", whole

    output = await _refused(api, {
        "name": "t", "steps": [{"id": "x", "type": "transform", "output": {"a": 1}}],
        "output": {"k": "{{ secrets.STRIPE_KEY }}"},
    })  # fmt: skip
    assert output["field"] == "definition.output", output

    # Another workspace's secret of that name is unknown here; the dry run says so too.
    r = await api.post("/api/v1/flows", charge("http://127.0.0.1:9/x"), who="other")
    assert r.status_code == 400 and "STRIPE_KEY" in r.text
    r = await api.post("/api/v1/flows/validate", charge("http://127.0.0.1:9/x"), who="other")
    assert r.status_code == 400 and "STRIPE_KEY" in r.text
    r = await api.post("/api/v1/flows/validate", charge("http://127.0.0.1:9/x"))
    assert r.status_code == 200, r.text
    # A new version of a flow is held to the same rule.
    flow_id = await api.create_flow(charge("http://127.0.0.1:9/x"))
    newer = charge("http://127.0.0.1:9/x")
    newer["steps"][0]["request"]["headers"]["X-Other"] = "{{ secrets.OTHER }}"
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=newer, headers=api.auth())
    assert r.status_code == 400 and "secrets.OTHER" in r.text, r.text


# -- an http step sends it; nothing keeps it ----------------------------------------------------


async def _all_rows_text(db: Database) -> str:
    """Every row of every table but the secrets' own, as text."""
    found = []
    async with db.read() as conn:
        for table in metadata.sorted_tables:
            if table.name == "step_secrets":
                continue
            for row in (await conn.execute(sa.select(table))).all():
                found.append(repr(tuple(row)))
    return "\n".join(found)


async def test_an_http_step_sends_the_value_and_every_surface_shows_its_name(
    api: Api, receiver: Receiver, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo(receiver)
    await endpoint(api, receiver.url + "/hook", ["flow.step_completed", "flow.completed"])
    assert (await add(api, "STRIPE_KEY", VALUE)).status_code == 201
    flow_id = await api.create_flow(charge(receiver.url + "/charge"))
    run_id = await api.execute(flow_id, {"amount": 12})
    run = await api.wait(run_id)
    assert run["status"] == "completed", run

    # The receiver got the real value, in the header and in the body.
    [sent] = [r for r in receiver.requests if r["path"] == "/charge"]
    assert sent["headers"]["Authorization"] == f"Bearer {VALUE}"
    assert orjson.loads(sent["body"])["key"] == VALUE

    # The answer echoed it: the step's output shows the name instead.
    [step] = run["steps"]
    echoed = step["output"]["json"]
    assert echoed["headers"]["Authorization"] == f"Bearer {SHOWN}"
    assert orjson.loads(echoed["body"])["key"] == SHOWN

    hooks = await until(lambda: len([r for r in receiver.requests if r["path"] == "/hook"]) >= 2)
    assert hooks
    bodies = [r["body"].decode() for r in receiver.requests if r["path"] == "/hook"]
    assert all(SHOWN in b for b in bodies), bodies

    answers = [
        (await api.get(f"/api/v1/flows/runs/{run_id}")).text,
        (await api.get(f"/api/v1/flows/runs/{run_id}/events")).text,
        (await api.get("/api/v1/events")).text,
        (await api.get("/api/v1/webhooks/deliveries")).text,
        (await api.get("/api/v1/flows/runs")).text,
        (await api.get("/api/v1/secrets")).text,
    ]
    async with asyncio.timeout(10):  # the SSE stream: the events so far, then it ends
        stream = await api.get(f"/api/v1/flows/runs/{run_id}/stream")
    assert "flow.completed" in stream.text and SHOWN in stream.text
    answers.append(stream.text)
    services: Services = api.app.state.services
    token, _ = await services.sessions.sign_in(api.keys["test"])
    api.client.cookies.set(COOKIE, token)
    page = await api.client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and SHOWN in page.text
    answers.append(page.text)
    answers.append((await api.client.get("/settings/secrets")).text)
    api.client.cookies.clear()
    assert SHOWN in answers[0] and SHOWN in answers[1] and SHOWN in answers[2]
    for answer in answers:
        assert VALUE not in answer
    rows = await _all_rows_text(db)
    assert SHOWN in rows
    assert VALUE not in rows
    assert VALUE not in caplog.text
    assert all(VALUE not in b for b in bodies)


async def test_a_secret_deleted_since_fails_the_step_with_error_type_secret(
    api: Api, receiver: Receiver
) -> None:
    assert (await add(api, "STRIPE_KEY", VALUE)).status_code == 201
    flow_id = await api.create_flow(charge(receiver.url + "/charge"))
    r = await api.client.delete("/api/v1/secrets/STRIPE_KEY", headers=api.auth())
    assert r.status_code == 204
    run = await api.wait(await api.execute(flow_id, {"amount": 1}))
    assert run["status"] == "failed", run
    assert run["steps"][0]["error"]["type"] == "secret"
    assert "STRIPE_KEY" in run["steps"][0]["error"]["message"]
    assert receiver.requests == []


async def test_an_error_that_names_the_value_shows_its_name(api: Api) -> None:
    """A refused connection's message holds the URL; a secret in the URL is not in it."""
    assert (await add(api, "TOKEN", "tok-abc-123-secret")).status_code == 201
    flow_id = await api.create_flow({"name": "u", "steps": [{
        "id": "call", "type": "http", "request": {"url": "http://127.0.0.1:9/{{ secrets.TOKEN }}"},
    }]})  # fmt: skip
    run = await api.wait(await api.execute(flow_id))
    assert run["status"] == "failed", run
    text = orjson.dumps(run).decode()
    assert "tok-abc-123-secret" not in text
    assert "[secret:TOKEN]" in run["steps"][0]["error"]["message"], run["steps"][0]["error"]


# -- rotation -----------------------------------------------------------------------------------


async def _seed_secret(url: str, key: str) -> str:
    db = Database(url, secret_key=key)
    try:
        await migrate(db)
        async with db.transaction() as conn:
            await store.insert_secret(
                conn, "ws_1", Mode.TEST, "STRIPE_KEY", VALUE, datetime.now(UTC)
            )
        async with db.read() as conn:
            return str((await conn.execute(sa.select(step_secrets.c.value))).scalar_one())
    finally:
        await db.dispose()


async def _read_secret(url: str, key: str) -> tuple[str, dict[str, str]]:
    db = Database(url, secret_key=key)
    try:
        async with db.read() as conn:
            stored = (await conn.execute(sa.select(step_secrets.c.value))).scalar_one()
            return stored, await store.values_of(conn, "ws_1", Mode.TEST, ["STRIPE_KEY"])
    finally:
        await db.dispose()


def test_rotation_reseals_step_secrets(database_url: str) -> None:
    old, new = generate_key(), generate_key()
    before = asyncio.run(_seed_secret(database_url, old))
    assert before.startswith(PREFIX) and VALUE not in before
    done = CliRunner().invoke(
        cli, ["secrets", "rotate", "--database-url", database_url],
        env={"FLOWHOOK_SECRET_KEY": f"{new},{old}"},
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "1 step secrets" in done.output
    after, values = asyncio.run(_read_secret(database_url, new))  # the old key gone: it opens
    assert after != before and after.startswith(PREFIX)
    assert values == {"STRIPE_KEY": VALUE}
