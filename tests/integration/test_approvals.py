"""``approval`` steps on both backends: decided by link (GET decides nothing, POST does), by
the API with a key, by timeout; a second decision; ``on_reject`` and ``on_timeout``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from tests.conftest import Api, Receiver


def refund_flow(**approval: Any) -> dict[str, Any]:
    step = {
        "id": "manager",
        "type": "approval",
        "message": "Refund {{ payload.amount }} EUR to {{ payload.customer }}?",
        **approval,
    }
    return {
        "name": "refund",
        "timeout_seconds": 600,
        "steps": [step, {"id": "pay", "type": "transform", "output": {"paid": True}}],
        "output": {"decision": "{{ steps.manager.output }}"},
    }


async def asked(api: Api, run_id: str) -> dict[str, Any]:
    """The ``flow.approval_requested`` payload, once the run is waiting for it."""
    async with asyncio.timeout(10):
        while True:
            events = (await api.get(f"/api/v1/flows/runs/{run_id}/events")).json()["data"]
            for e in events:
                if e["event"] == "flow.approval_requested":
                    return dict(e["body"]["payload"])
            await asyncio.sleep(0.02)


def path(url: str) -> str:
    return urlsplit(url).path


async def test_approved_with_a_key_and_a_second_decision_is_refused(api: Api) -> None:
    flow = refund_flow(timeout_seconds=3600)
    flow["steps"].insert(1, {"id": "settle", "type": "delay", "seconds": 1})  # still going
    flow_id = await api.create_flow(flow)
    run_id = await api.execute(flow_id, {"amount": 40, "customer": "Ada"})
    request = await asked(api, run_id)
    assert request["step_id"] == "manager"
    assert request["message"] == "Refund 40 EUR to Ada?"
    assert request["approve_url"].startswith("http://127.0.0.1:8080/approvals/")
    assert request["reject_url"] != request["approve_url"] and request["expires_at"].endswith("Z")
    run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
    [step] = [s for s in run["steps"] if s["id"] == "manager"]
    assert step["status"] == "waiting" and step["output"]["message"] == "Refund 40 EUR to Ada?"
    assert "approve_url" not in step["output"]  # the links live only in the event

    r = await api.post(
        f"/api/v1/flows/runs/{run_id}/steps/manager/approve", {"comment": "fine by me"}
    )
    assert r.status_code == 200, r.text
    decision = r.json()
    assert decision["approved"] is True and decision["comment"] == "fine by me"
    assert decision["decided_by"].startswith("key key_")
    again = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/reject")
    assert again.status_code == 409 and again.json()["code"] == "already_decided", again.text
    link = await api.client.post(path(request["reject_url"]))
    assert link.status_code == 409  # the links are dead too
    done = await api.wait(run_id)
    assert done["status"] == "completed", done
    output = done["output"]["decision"]
    assert (output["approved"], output["comment"]) == (True, "fine by me")
    assert output["decided_at"] == decision["decided_at"]


async def test_a_link_s_get_decides_nothing_its_post_does(api: Api) -> None:
    flow_id = await api.create_flow(refund_flow())
    run_id = await api.execute(flow_id, {"amount": 9, "customer": "Bo"})
    request = await asked(api, run_id)
    for _ in range(3):  # a mail scanner fetching the link, a preview, the person
        page = await api.client.get(path(request["reject_url"]))
        assert page.status_code == 200 and "Reject?" in page.text
        assert "Refund 9 EUR to Bo?" in page.text
        assert page.headers["cache-control"] == "no-store"
        # the link's token must not leave in the Referer of the page's static files: the
        # route's policy is the one policy sent, not followed by the pages' same-origin
        assert page.headers.get_list("referrer-policy") == ["no-referrer"]
    await asyncio.sleep(0.2)
    assert (await api.get(f"/api/v1/flows/runs/{run_id}")).json()["status"] == "running"

    decided = await api.client.post(
        path(request["reject_url"]),
        content=b"comment=too+much",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert decided.status_code == 200 and "Rejected" in decided.text, decided.text
    again = await api.client.post(path(request["approve_url"]))
    assert again.status_code == 409 and "Already decided" in again.text
    failed = await api.wait(run_id)
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "rejected" and failed["error"]["step"] == "manager"
    assert failed["error"]["message"] == "rejected by link: too much"
    [step] = failed["steps"]
    assert step["output"]["decided_by"] == "link" and step["output"]["approved"] is False

    unknown = await api.client.get("/approvals/" + "x" * 43)
    assert unknown.status_code == 404 and "does not exist" in unknown.text
    assert (await api.client.post("/approvals/" + "x" * 43)).status_code == 404


async def test_on_reject_continue_goes_on_with_approved_false(api: Api) -> None:
    flow_id = await api.create_flow(refund_flow(on_reject="continue"))
    run_id = await api.execute(flow_id, {"amount": 1, "customer": "C"})
    await asked(api, run_id)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/reject")
    assert r.status_code == 200 and r.json()["approved"] is False
    done = await api.wait(run_id)
    assert done["status"] == "completed" and done["output"]["decision"]["approved"] is False


async def test_timeouts_fail_approve_or_reject(api: Api) -> None:
    failing = await api.create_flow(refund_flow(timeout_seconds=0.3))
    run_id = await api.execute(failing, {"amount": 1, "customer": "D"})
    request = await asked(api, run_id)
    failed = await api.wait(run_id)
    assert failed["status"] == "failed" and failed["error"]["type"] == "approval_timeout"
    late = await api.client.post(path(request["approve_url"]))
    assert late.status_code == 409  # expired, and the run has ended

    approving = await api.create_flow(refund_flow(timeout_seconds=0.3, on_timeout="approve"))
    done = await api.wait(await api.execute(approving, {"amount": 1, "customer": "E"}))
    assert done["status"] == "completed"
    assert done["output"]["decision"]["approved"] is True
    assert done["output"]["decision"]["decided_by"] == "timeout"

    rejecting = await api.create_flow(
        refund_flow(timeout_seconds=0.3, on_timeout="reject", on_reject="continue")
    )
    done = await api.wait(await api.execute(rejecting, {"amount": 1, "customer": "F"}))
    assert done["status"] == "completed" and done["output"]["decision"]["approved"] is False


async def test_an_expired_request_is_refused_before_the_run_wakes(api: Api) -> None:
    """Past its expiry a request takes no decision, by link or by key, even while the run
    has not yet woken up to time it out."""
    from sqlalchemy import update

    from flowhook.store.tables import approvals

    flow_id = await api.create_flow(refund_flow(timeout_seconds=3600))
    run_id = await api.execute(flow_id, {"amount": 2, "customer": "H"})
    request = await asked(api, run_id)
    async with api.app.state.services.db.transaction() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        await conn.execute(
            update(approvals).where(approvals.c.run_id == run_id).values(expires_at=past)
        )
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve")
    assert r.status_code == 409 and r.json()["code"] == "expired", r.text
    link = await api.client.post(path(request["approve_url"]))
    assert link.status_code == 409
    run = (await api.get(f"/api/v1/flows/runs/{run_id}")).json()
    assert run["status"] == "running"  # nothing was decided: the run still waits
    await api.post(f"/api/v1/flows/runs/{run_id}/cancel")


async def test_the_request_reaches_an_endpoint_and_its_link_decides(
    api: Api, receiver: Receiver
) -> None:
    """The README's refund: a manager's endpoint receives ``flow.approval_requested`` with
    the links, and a POST to the approve link lets the run go on."""
    import orjson

    r = await api.post(
        "/api/v1/webhooks/endpoints",
        {"url": receiver.url, "events": ["flow.approval_requested"]},
    )
    assert r.status_code == 201, r.text
    flow_id = await api.create_flow(refund_flow(timeout_seconds=3600))
    run_id = await api.execute(flow_id, {"amount": 90, "customer": "Ida"})
    async with asyncio.timeout(10):
        while not receiver.of("flow.approval_requested"):
            await asyncio.sleep(0.02)
    [delivery] = receiver.of("flow.approval_requested")
    event = orjson.loads(delivery["body"])
    assert event["run_id"] == run_id
    payload = event["payload"]
    assert set(payload) >= {"step_id", "message", "approve_url", "reject_url", "expires_at"}
    assert payload["message"] == "Refund 90 EUR to Ida?"
    decided = await api.client.post(path(payload["approve_url"]))
    assert decided.status_code == 200, decided.text
    done = await api.wait(run_id)
    assert done["status"] == "completed" and done["output"]["decision"]["approved"] is True


async def test_refusals(api: Api) -> None:
    flow_id = await api.create_flow(refund_flow())
    run_id = await api.execute(flow_id, {"amount": 1, "customer": "G"})
    await asked(api, run_id)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/nope/approve")
    assert r.status_code == 404
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve", who="other")
    assert r.status_code == 404
    r = await api.post(
        f"/api/v1/flows/runs/{run_id}/steps/manager/approve", {"comment": "x" * 2001}
    )
    assert r.status_code in (400, 422)
    r = await api.post("/api/v1/flows", {"name": "x", "steps": [
        {"id": "a", "type": "approval", "on_timeout": "continue"}]})  # fmt: skip
    assert r.status_code == 400 and "on_timeout" in r.json()["error"], r.text
    # cancelling the run closes the request
    await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve")
    assert r.status_code == 409 and r.json()["code"] == "run_finished"
