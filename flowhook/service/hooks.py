"""Inbound webhooks: a public URL bound to a flow or to a signal name. Every arrival raises
``webhook.delivered`` (accepted or not, and why); an accepted one also raises
``webhook.received`` and starts a run with trigger ``webhook`` (a flow's hook) or sends the
signal with the arrival's body as its ``data`` (a signal's hook), all in one transaction.

The signature is checked before the hook's rate limit is charged, so forged requests cannot
use up the sender's allowance; refused arrivals have a bucket of their own. A delivery id seen
before (the hook's ``dedup_header``, or ``webhook-id`` on a Standard Webhooks hook, whose
signed timestamp bounds how late a copy can come) answers with the run it started (or the
signal it sent), and starts (or sends) no other: a signal's hook gives the signal an ``id``
derived from the hook and the delivery id, so the signals' own deduplication applies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import orjson

from flowhook import tracing
from flowhook.clock import Clock
from flowhook.definition.input_schema import check_payload
from flowhook.errors import (
    Duplicate,
    FlowhookError,
    InvalidInput,
    InvalidPayload,
    NotFound,
    Unauthenticated,
)
from flowhook.events import make_event
from flowhook.ids import is_id, new_id, new_secret_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import encode_json
from flowhook.service.lookup import find, missing
from flowhook.service.pagination import Page, listed
from flowhook.service.ratelimit import TokenBuckets
from flowhook.service.signals import Sent, check_name, store_signal
from flowhook.signing import new_secret, secret_key_bytes, standard_signature
from flowhook.store import events as events_store
from flowhook.store import flows as flows_store
from flowhook.store import hooks as store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.hooks import Hook
from flowhook.store.models import Run, RunStatus
from flowhook.store.signals import Signal

__all__ = ["HookService", "Arrival", "Received", "DEFAULT_RATE_LIMIT"]

DEFAULT_RATE_LIMIT = 600
"""Arrivals a minute per hook and process."""
MAX_TIMESTAMP_SKEW = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True, slots=True)
class Arrival:
    run_id: str | None
    """The run it started (a flow's hook)."""
    duplicate: bool
    sent: Sent | None = None
    """The signal it sent (a signal's hook): for a duplicate, the first arrival's."""


@dataclass(frozen=True, slots=True)
class _Payload:
    body: bytes
    content_type: str
    payload: dict[str, Any]
    encoded: orjson.Fragment
    traceparent: str | None = None
    """The sender's W3C trace context, when valid: the run joins its trace."""


class _Refused(FlowhookError):
    def __init__(self, error: FlowhookError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


ARRIVALS_SHOWN = 3
"""Arrivals the Triggers page shows per hook."""
ARRIVALS_SCAN = 5000
"""How many of a workspace's latest events the Triggers page looks through for arrivals."""


@dataclass(frozen=True, slots=True)
class Received:
    """One arrival at a hook, as its ``webhook.delivered`` event tells it."""

    at: datetime
    accepted: bool
    reason: str | None
    run_id: str | None
    """The run it started (a flow's hook, accepted), else ``None``."""
    size: int


class HookService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock
        self._buckets = TokenBuckets()

    async def create(
        self, who: Principal, *, flow_id: str | None = None, signal: str | None = None,
        verify: dict[str, Any] | None = None, dedup_header: str | None = None,
        rate_limit: int = DEFAULT_RATE_LIMIT,
    ) -> Hook:  # fmt: skip
        """A hook whose arrivals start runs of ``flow_id``, or send the signal ``signal``
        (exactly one of the two)."""
        if (flow_id is None) == (signal is None):
            raise InvalidInput(
                "give flow_id (each arrival starts a run of that flow) or signal (each "
                "arrival sends that signal with the body as its data), not both",
                field="signal" if signal is not None else "flow_id",
            )
        if signal is not None:
            check_name(signal, "signal")
        else:
            assert flow_id is not None
            async with self._db.read() as conn:
                if await flows_store.get_flow(conn, who.workspace_id, who.mode, flow_id) is None:
                    raise missing("flow", flow_id)
        hook = Hook(
            new_secret_id("hk"), who.workspace_id, who.mode, flow_id, _check_verify(verify),
            dedup_header or None, rate_limit, self._clock.now(), signal=signal,
        )  # fmt: skip
        async with self._db.transaction() as conn:
            await store.insert_hook(conn, hook)
        return hook

    async def get(self, who: Principal, hook_id: str) -> Hook:
        return await find(
            self._db, "hook", "hk", hook_id,
            lambda conn: store.get_hook(conn, hook_id, who.workspace_id, who.mode),
        )  # fmt: skip

    async def list(self, who: Principal, *, limit: int, cursor: str | None) -> Page[Hook]:
        return await listed(
            self._db, "hk", limit=limit, cursor=cursor, cursor_of=lambda row: row.id,
            fetch=lambda conn, after, n: store.list_hooks(
                conn, who.workspace_id, who.mode, limit=n, after=after
            ),
        )  # fmt: skip

    async def recent_arrivals(
        self, who: Principal, *, per_hook: int = ARRIVALS_SHOWN, scan: int = ARRIVALS_SCAN
    ) -> dict[str, tuple[Received, ...]]:
        """Each hook's latest arrivals (``per_hook`` at most, newest first), accepted or
        refused and why, from the ``webhook.delivered`` events among the scope's latest
        ``scan`` events: the Triggers page's read, bounded however busy the workspace."""
        async with self._db.read() as conn:
            found = await events_store.latest_of_type(
                conn, who.workspace_id, who.mode, "webhook.delivered", scan=scan
            )
        arrivals: dict[str, tuple[Received, ...]] = {}
        for event in found:
            body = orjson.loads(event.payload)
            hook_id = str(body.get("hook_id"))
            shown = arrivals.get(hook_id, ())
            if len(shown) < per_hook:
                size = int(body.get("size") or 0)
                received = Received(
                    event.created_at, bool(body.get("accepted")), body.get("reason"),
                    event.run_id, size,
                )  # fmt: skip
                arrivals[hook_id] = (*shown, received)
        return arrivals

    async def delete(self, who: Principal, hook_id: str) -> None:
        hook = await self.get(who, hook_id)
        async with self._db.transaction() as conn:
            await store.delete_hook(conn, hook.id)

    async def rotate(self, who: Principal, hook_id: str) -> Hook:
        """A new URL (and a new secret, when it verifies); the old URL stops working."""
        old = await self.get(who, hook_id)
        verify = (
            _check_verify(
                {
                    "type": old.verify["type"],
                    **{k: v for k, v in old.verify.items() if k != "secret"},
                }
            )
            if old.verify
            else None
        )
        hook = Hook(
            new_secret_id("hk"),
            old.workspace_id,
            old.mode,
            old.flow_id,
            verify,
            old.dedup_header,
            old.rate_limit,
            self._clock.now(),
            signal=old.signal,
        )
        async with self._db.transaction() as conn:
            await store.insert_hook(conn, hook)
            await store.delete_hook(conn, old.id)
        return hook

    def _allow(self, hook: Hook, *, refused: bool = False) -> None:
        """``rate_limit`` arrivals a minute, in bursts up to the same number; refused ones
        count apart from the others."""
        self._buckets.take(
            f"refused:{hook.id}" if refused else hook.id,
            rate=hook.rate_limit / 60,
            burst=float(hook.rate_limit),
            what="to this hook",
        )

    async def receive(
        self, hook_id: str, body: bytes, content_type: str, headers: Mapping[str, str]
    ) -> Arrival:
        """Take one arrival at the public URL; raises (after recording why) when refused."""
        if not is_id(hook_id, "hk"):
            raise NotFound("no such hook")
        async with self._db.read() as conn:
            hook = await store.get_hook(conn, hook_id)
        if hook is None:
            raise NotFound("no such hook")
        lowered = {k.lower(): v for k, v in headers.items()}
        try:
            try:
                _verify(hook, body, lowered, int(self._clock.now().timestamp()))
            except _Refused:
                self._allow(hook, refused=True)
                raise
            self._allow(hook)
            payload = _payload(body, content_type)
            encoded = encode_json(payload, "the body")
        except InvalidInput as exc:
            await self._record_refusal(hook, body, content_type, "invalid JSON")
            raise exc from None
        except _Refused as refused:
            await self._record_refusal(hook, body, content_type, refused.reason)
            raise refused.error from None
        key = _delivery_id(hook, lowered)
        caller = tracing.parse(lowered.get("traceparent"))  # invalid: a trace of its own
        arrival = _Payload(
            body, content_type, payload, encoded, None if caller is None else str(caller)
        )
        accept = self._accept if hook.signal is None else self._send
        try:
            return await accept(hook, arrival, key)
        except Duplicate:
            # The same delivery id committed by a concurrent request first: answer as its copy.
            return await accept(hook, arrival, key)
        except InvalidPayload as refused:  # the flow's input_schema: nothing of it was kept
            reason = f"payload does not match the flow's input_schema ({refused.field})"
            await self._record_refusal(hook, body, content_type, reason)
            raise

    async def _record_refusal(
        self, hook: Hook, body: bytes, content_type: str, reason: str
    ) -> None:
        """The ``webhook.delivered`` event of an arrival refused before any run was made."""
        async with self._db.transaction() as conn:
            await events_store.insert_events(
                conn, [self._delivered(hook, body, content_type, False, reason, None)]
            )

    def _delivered(
        self,
        hook: Hook,
        body: bytes,
        content_type: str,
        accepted: bool,
        reason: str | None,
        run_id: str | None,
        signal_id: str | None = None,
    ) -> Any:
        payload = {"hook_id": hook.id, "accepted": accepted, "reason": reason,
                   "content_type": content_type, "size": len(body)}  # fmt: skip
        if hook.signal is not None:
            payload |= {"signal": hook.signal, "signal_id": signal_id}
        return make_event(
            "webhook.delivered", workspace_id=hook.workspace_id, mode=hook.mode, flow_id=hook.flow_id,
            run_id=run_id, now=self._clock.now(), payload=payload,
        )  # fmt: skip

    async def _send(self, hook: Hook, arrival: _Payload, key: str | None) -> Arrival:
        """A signal's hook: the arrival's body sent as the signal's ``data``, with the events
        that say so, in one transaction."""
        assert hook.signal is not None
        now = self._clock.now()
        signal = Signal(
            id=new_id("sig"), workspace_id=hook.workspace_id, mode=hook.mode, name=hook.signal,
            data=arrival.payload, created_at=now, dedup_key=_signal_key(hook, key),
        )  # fmt: skip
        async with self._db.transaction() as conn:
            sent = await store_signal(conn, signal)
            sig = sent.signal.id
            reason = "duplicate delivery id" if sent.duplicate else None
            events = [
                self._delivered(
                    hook, arrival.body, arrival.content_type, not sent.duplicate, reason, None, sig
                )
            ]
            if not sent.duplicate:
                payload = {"hook_id": hook.id, "signal": hook.signal, "signal_id": sig,
                           "matched": sent.matched}  # fmt: skip
                received = make_event(
                    "webhook.received", workspace_id=hook.workspace_id, mode=hook.mode,
                    flow_id=None, run_id=None, now=now, payload=payload,
                )  # fmt: skip
                events.append(received)
            await events_store.insert_events(conn, events)
        return Arrival(None, sent.duplicate, sent)

    async def _accept(self, hook: Hook, arrival: _Payload, key: str | None) -> Arrival:
        body, content_type = arrival.body, arrival.content_type
        now = self._clock.now()
        async with self._db.transaction() as conn:
            if key is not None:
                earlier = await store.seen_delivery(conn, hook.id, key)
                if earlier is not None:
                    await events_store.insert_events(
                        conn,
                        [
                            self._delivered(
                                hook, body, content_type, False, "duplicate delivery id", earlier
                            )
                        ],
                    )
                    return Arrival(earlier, duplicate=True)
            assert hook.flow_id is not None
            flow = await flows_store.get_flow(conn, hook.workspace_id, hook.mode, hook.flow_id)
            if flow is None:
                raise NotFound("the flow of this hook was archived")
            schema = flow.definition.get("input_schema")
            if schema is not None:  # 400 naming the fields: no run (receive records why)
                check_payload(flow.flow_id, flow.version, schema, arrival.payload)
            run = Run(
                run_id=new_id("run"), workspace_id=hook.workspace_id, mode=hook.mode, flow_id=flow.flow_id,
                flow_version=flow.version, trigger="webhook", status=RunStatus.QUEUED,
                payload=arrival.payload, queued_at=now, traceparent=arrival.traceparent,
            )  # fmt: skip
            await runs_store.insert_run(conn, run, payload=arrival.encoded)
            if key is not None:
                await store.remember_delivery(conn, hook.id, key, run.run_id, now)
            received = make_event(
                "webhook.received", workspace_id=hook.workspace_id, mode=hook.mode, flow_id=hook.flow_id,
                run_id=run.run_id, payload={"hook_id": hook.id, "run_id": run.run_id}, now=now,
            )  # fmt: skip
            await events_store.insert_events(
                conn, [self._delivered(hook, body, content_type, True, None, run.run_id), received]
            )
        return Arrival(run.run_id, duplicate=False)


def _signal_key(hook: Hook, key: str | None) -> str | None:
    """The ``id`` of the signal an arrival with provider delivery id ``key`` sends: the same
    for every copy of that delivery to this hook (and not guessable from the key alone)."""
    if key is None:
        return None
    digest = hashlib.sha256(f"{hook.id}\n{key}".encode()).hexdigest()
    return f"hook:{digest}"


def _check_verify(verify: dict[str, Any] | None) -> dict[str, Any] | None:
    if not verify:
        return None
    kind = verify.get("type")
    for name in ("header", "secret"):
        if not isinstance(verify.get(name, ""), str | None):
            raise InvalidInput(f"verify.{name} must be a string", field=f"verify.{name}")
    if kind == "hmac":
        encoding = verify.get("encoding", "hex")
        if encoding not in ("hex", "base64"):
            raise InvalidInput("verify.encoding must be hex or base64", field="verify.encoding")
        header = str(verify.get("header") or "X-Signature")
        secret = str(verify.get("secret") or secrets.token_urlsafe(32))
        return {"type": "hmac", "header": header, "encoding": encoding, "secret": secret}
    if kind == "standard":
        secret = str(verify.get("secret") or new_secret())
        if not secret.startswith("whsec_"):
            raise InvalidInput(
                "verify.secret for Standard Webhooks must start with whsec_", field="verify.secret"
            )
        try:
            secret_key_bytes(secret)
        except ValueError:
            raise InvalidInput(
                "verify.secret is not whsec_ followed by base64", field="verify.secret"
            ) from None
        return {"type": "standard", "secret": secret}
    raise InvalidInput("verify.type must be hmac or standard", field="verify.type")


def _delivery_id(hook: Hook, headers: Mapping[str, str]) -> str | None:
    """The provider's id of this delivery, by which a copy of it is recognised. On a
    Standard Webhooks hook it is always the signed ``webhook-id`` (an unsigned header could
    be changed by whoever replays a captured request)."""
    if hook.verify and hook.verify["type"] == "standard":
        key = headers.get("webhook-id")  # signed, and checked by _verify
    elif hook.dedup_header:
        key = headers.get(hook.dedup_header.lower())
    else:
        key = None
    return key[:200] if key else None


def _same(expected: str, given: str) -> bool:
    """Constant-time comparison of a signature we computed with one from a header (any
    characters: a header that is not ASCII simply does not match)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


def _verify(hook: Hook, body: bytes, headers: Mapping[str, str], now: int) -> None:
    verify = hook.verify
    if not verify:
        return
    if verify["type"] == "hmac":
        given = headers.get(verify["header"].lower(), "").strip()
        if not given:
            raise _Refused(
                Unauthenticated(f"missing {verify['header']} header"), "missing signature"
            )
        given = given.split("=", 1)[1] if given.startswith("sha256=") else given
        digest = hmac.new(verify["secret"].encode(), body, hashlib.sha256).digest()
        expected = (
            digest.hex() if verify["encoding"] == "hex" else base64.b64encode(digest).decode()
        )
        if not _same(expected, given):
            raise _Refused(Unauthenticated("signature does not match the body"), "bad signature")
        return
    msg_id, stamp, signatures = (
        headers.get("webhook-id"),
        headers.get("webhook-timestamp"),
        headers.get("webhook-signature"),
    )
    if not (msg_id and stamp and signatures):
        raise _Refused(Unauthenticated("missing Standard Webhooks headers"), "missing signature")
    if not _TIMESTAMP.fullmatch(stamp):
        raise _Refused(
            Unauthenticated("webhook-timestamp must be whole seconds since 1970 (UTC)"),
            "bad timestamp",
        )
    if abs(now - int(stamp)) > MAX_TIMESTAMP_SKEW:
        raise _Refused(
            Unauthenticated("webhook-timestamp is too old or in the future"), "stale timestamp"
        )
    expected = standard_signature(verify["secret"], msg_id, int(stamp), body)
    if not any(_same(expected, s) for s in signatures.split()):
        raise _Refused(Unauthenticated("signature does not match the body"), "bad signature")


def _payload(body: bytes, content_type: str) -> dict[str, Any]:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        try:
            value = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            raise _Refused(InvalidInput("the body is not valid JSON"), "malformed JSON") from None
        return value if isinstance(value, dict) else {"body": value}
    text = body.decode("utf-8", "replace")
    if media == "application/x-www-form-urlencoded":
        return {
            k: v[0] if len(v) == 1 else v for k, v in parse_qs(text, keep_blank_values=True).items()
        }
    return {"body": text}
