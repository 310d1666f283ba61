"""API keys' labels and last use on both backends: a label is trimmed and checked, names the
key in "approved by"; each process writes when its keys were last used, off the request path;
the settings screen's key actions reach only the session's own workspace and mode."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flowhook.clock import FakeClock
from flowhook.errors import InvalidInput, NotFound
from flowhook.service.auth import KeyService, Principal
from flowhook.store.db import Database
from flowhook.store.models import Mode
from tests.conftest import Api
from tests.integration.test_approvals import asked


async def test_a_label_is_trimmed_checked_and_kept(db: Database) -> None:
    keys = KeyService(db, FakeClock())
    made = await keys.create(Mode.TEST, "acme", label="  CI deploys ")
    assert made.api_key.label == "CI deploys"
    [listed] = await keys.list("acme")
    assert listed.label == "CI deploys" and listed.last_used_at is None
    blank = await keys.create(Mode.TEST, "acme", label="   ")
    assert blank.api_key.label is None
    with pytest.raises(InvalidInput, match="at most 100 characters, not 101"):
        await keys.create(Mode.TEST, "acme", label="x" * 101)
    with pytest.raises(InvalidInput, match="control characters"):
        await keys.create(Mode.TEST, "acme", label="two\nlines")
    assert len(await keys.list("acme")) == 2  # the refused ones wrote nothing
    assert await keys.describe(made.api_key.id) == f'key "CI deploys" ({made.api_key.id})'
    assert await keys.describe(blank.api_key.id) == f"key {blank.api_key.id}"


async def test_last_use_is_written_by_record_use_not_by_the_request(db: Database) -> None:
    clock = FakeClock()
    keys = KeyService(db, clock)
    used = await keys.create(Mode.TEST, "acme", label="used")
    idle = await keys.create(Mode.TEST, "acme", label="idle")
    who = await keys.authenticate(f"Bearer {used.key}")
    assert who.key_id == used.api_key.id
    assert {k.label: k.last_used_at for k in await keys.list("acme")} == {
        "used": None, "idle": None,
    }  # fmt: skip
    first = clock.now()
    await keys.record_use()
    found = {k.label: k.last_used_at for k in await keys.list("acme")}
    assert found == {"used": first, "idle": None}
    clock.advance(60)
    await keys.record_use()  # no use since: nothing changes
    assert (await keys.get(used.api_key.id)).last_used_at == first  # type: ignore[union-attr]
    await keys.authenticate(f"Bearer {used.key}")  # from the cache: still counted
    await keys.record_use()
    later = (await keys.get(used.api_key.id)).last_used_at  # type: ignore[union-attr]
    assert later == first + timedelta(seconds=60)
    assert (await keys.get(idle.api_key.id)).last_used_at is None  # type: ignore[union-attr]


async def test_the_screen_makes_and_revokes_keys_of_its_own_workspace_and_mode(
    db: Database,
) -> None:
    keys = KeyService(db, FakeClock())
    mine = await keys.create(Mode.TEST, "acme")
    live = await keys.create(Mode.LIVE, "acme", label="production")
    theirs = await keys.create(Mode.TEST, "other")
    who = Principal(mine.api_key.workspace_id, Mode.TEST, mine.api_key.id)

    made = await keys.create_for(who, " nightly job ")
    assert made.key.startswith("sk_test_") and made.api_key.label == "nightly job"
    assert (await keys.authenticate(f"Bearer {made.key}")).workspace_id == who.workspace_id
    listed = await keys.list_for(who)
    assert {k.id for k in listed} == {mine.api_key.id, made.api_key.id}  # not the live one
    for other in (live, theirs):  # the other mode's key, another workspace's key
        with pytest.raises(NotFound):
            await keys.revoke_for(who, other.api_key.id)
    with pytest.raises(NotFound):
        await keys.revoke_for(who, "key_nope")
    assert (await keys.get(live.api_key.id)).revoked_at is None  # type: ignore[union-attr]
    gone = await keys.revoke_for(who, made.api_key.id)
    assert gone.revoked_at is not None
    with pytest.raises(Exception, match="unknown or revoked"):
        await keys.authenticate(f"Bearer {made.key}")


async def test_approved_by_names_the_key_by_its_label(api: Api) -> None:
    services = api.app.state.services
    labelled = await services.keys.create(Mode.TEST, "acme", label="Ops on call")
    api.keys["ops"] = labelled.key
    flow_id = await api.create_flow({"name": "refund", "steps": [
        {"id": "manager", "type": "approval", "message": "Refund?"}]})  # fmt: skip
    run_id = await api.execute(flow_id)
    await asked(api, run_id)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve", who="ops")
    assert r.status_code == 200, r.text
    assert r.json()["decided_by"] == f'key "Ops on call" ({labelled.api_key.id})'
