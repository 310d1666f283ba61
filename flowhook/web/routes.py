"""Pages: sign in with an API key (landing on the overview, flowhook/web/overview.py), Settings →
Webhooks, deliveries, runs and flows.

Every page reads through the same services as the API, as the session's workspace and mode;
every form carries the session's CSRF token and is refused without it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.templating import Jinja2Templates
from starlette.responses import RedirectResponse, Response

from flowhook.api.deps import ServicesDep
from flowhook.api.routes.streams import open_run_stream
from flowhook.clock import isoformat
from flowhook.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated
from flowhook.events import EVENT_TYPES
from flowhook.service import Principal, Services
from flowhook.service.sessions import session_hash
from flowhook.signing import build_headers, new_secret
from flowhook.store.models import Run, RunStatus, RunStep, StepStatus
from flowhook.store.sessions import WebSession
from flowhook.web.security import foreign_origin, secure_cookie

__all__ = ["router", "render_error", "COOKIE", "LANDING", "STATIC_DIR"]

COOKIE = "flowhook_session"
LANDING = "/overview"
"""Where a signed-in browser starts."""
HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _ts(value: datetime | str | None) -> str:
    """A time as the pages show it (``2026-11-23 10:15:30 UTC``); ``value`` may be ISO text."""
    if not value:
        return "—"
    text = value if isinstance(value, str) else isoformat(value)
    return text.replace("T", " ")[:19] + " UTC"


templates.env.filters["ts"] = _ts
templates.env.filters["pretty"] = lambda v: json.dumps(
    v, indent=2, ensure_ascii=False, sort_keys=False
)
templates.env.filters["prettyb"] = lambda b: json.dumps(
    orjson.loads(b), indent=2, ensure_ascii=False
)

router = APIRouter(include_in_schema=False)


class _SignIn(Exception):
    pass


class Page:
    """The signed-in caller of a page."""

    def __init__(
        self, request: Request, services: Services, who: Principal, session: WebSession
    ) -> None:
        self.request = request
        self.services = services
        self.who = who
        self.session = session

    def render(self, template: str, code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(
            self.request,
            template,
            {
                "who": self.who,
                "csrf": self.session.csrf_token,
                "nav": template.split(".")[0],
                **context,
            },
            status_code=code,
        )

    async def form(self) -> dict[str, list[str]]:
        """The posted form, after its CSRF token is checked."""
        body = (await self.request.body()).decode("utf-8", "replace")
        fields = parse_qs(body, keep_blank_values=True)
        try:
            self.services.sessions.check_csrf(self.session, first(fields, "csrf") or None)
        except Unauthenticated as exc:
            raise Forbidden(exc.message) from None
        return fields


async def page(request: Request, services: ServicesDep) -> Page:
    found = await services.sessions.resume(request.cookies.get(COOKIE))
    if found is None:
        raise _SignIn
    return Page(request, services, *found)


PageDep = Depends(page)


def redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


def first(fields: dict[str, list[str]], name: str, default: str = "") -> str:
    return (fields.get(name) or [default])[0]


async def render_error(request: Request, status: int, message: str) -> Response:
    if status == 401 and request.method == "GET":
        return redirect("/signin")
    return templates.TemplateResponse(
        request,
        "error.html",
        {"status": status, "message": message, "who": None, "nav": ""},
        status_code=status,
    )


async def _to_sign_in(_request: Request, _exc: Exception) -> Response:
    return redirect("/signin")


def install(app: Any) -> None:
    app.add_exception_handler(_SignIn, _to_sign_in)


# Sign in and out


@router.get("/")
async def home(request: Request, services: ServicesDep) -> Response:
    found = await services.sessions.resume(request.cookies.get(COOKIE))
    return redirect(LANDING if found else "/signin")


@router.get("/signin")
async def signin_form(request: Request) -> Response:
    return templates.TemplateResponse(
        request, "signin.html", {"who": None, "nav": "", "error": None}
    )


@router.post("/signin")
async def signin(request: Request, services: ServicesDep) -> Response:
    refused = foreign_origin(request, services.settings.public_url)
    if refused is not None:  # login CSRF: another site must not sign a browser in
        return await render_error(
            request,
            403,
            f"Sign-in refused: {refused}. Open this site's sign-in page and sign in there.",
        )
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = first(fields, "api_key").strip()
    try:
        token, _session = await services.sessions.sign_in(key)
    except Unauthenticated:
        return templates.TemplateResponse(
            request,
            "signin.html",
            {
                "who": None,
                "nav": "",
                "error": "That key is not valid: paste a sandbox (sk_test_…) or live (sk_live_…) key.",
            },
            status_code=401,
        )
    response = redirect(LANDING)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="lax",
        secure=secure_cookie(request, services.settings),
        max_age=12 * 3600,
    )
    return response


@router.post("/signout")
async def signout(p: Page = PageDep) -> Response:
    await p.form()
    await p.services.sessions.sign_out(p.request.cookies.get(COOKIE))
    response = redirect("/signin")
    response.delete_cookie(COOKIE)
    return response


# Settings → Webhooks


@router.get("/settings/webhooks")
async def webhooks(p: Page = PageDep) -> Response:
    endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
    health = await p.services.webhooks.health(p.who, endpoints)
    return p.render(
        "webhooks.html", endpoints=endpoints, health=health, events=EVENT_TYPES, error=None,
        form={}, flows=await _flow_choices(p),
    )  # fmt: skip


async def _flow_choices(p: Page) -> list[Any]:
    """The flows an endpoint's filter may name, by name."""
    return list((await p.services.flows.list(p.who, limit=100, cursor=None)).data)


def _delivery_controls(fields: dict[str, list[str]]) -> dict[str, Any]:
    """An endpoint form's pace and order fields, as the service takes them (a rate that is
    not a number is left for the service to refuse, naming the field)."""
    given = first(fields, "rate_limit").strip()
    rate: Any = None
    if given:
        try:
            rate = float(given)
        except ValueError:
            rate = given
    flow_ids = [f for f in fields.get("flow_ids", []) if f]
    return {
        "rate_limit": rate,
        "ordering": "fifo" if first(fields, "fifo") else None,
        "filter": flow_ids or None,
    }


@router.post("/settings/webhooks")
async def webhooks_create(p: Page = PageDep) -> Response:
    fields = await p.form()
    url, description, chosen = (
        first(fields, "url").strip(),
        first(fields, "description"),
        fields.get("events", []),
    )
    controls = _delivery_controls(fields)
    try:
        ep = await p.services.webhooks.create_endpoint(
            p.who, url=url, events=chosen, description=description, **controls
        )
    except InvalidInput as exc:
        endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
        health = await p.services.webhooks.health(p.who, endpoints)
        form = {
            "url": url,
            "description": description,
            "events": chosen,
            "rate_limit": first(fields, "rate_limit"),
            "fifo": bool(controls["ordering"]),
            "flow_ids": controls["filter"],
        }
        return p.render(
            "webhooks.html", 400, endpoints=endpoints, health=health, events=EVENT_TYPES,
            error=exc.message, form=form, flows=await _flow_choices(p),
        )  # fmt: skip
    return redirect(f"/settings/webhooks/{ep.id}?created=1")


async def _endpoint_page(
    p: Page,
    endpoint_id: str,
    *,
    secret: bool = False,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    ep = await p.services.webhooks.get_endpoint(p.who, endpoint_id)
    failed = await p.services.webhooks.list_deliveries(
        p.who, limit=20, cursor=None, status="failed", endpoint_id=ep.id
    )
    health = (await p.services.webhooks.health(p.who, [ep]))[ep.id]
    created = p.request.query_params.get("created") == "1"
    return p.render(
        "endpoint.html", status, ep=ep, events=EVENT_TYPES, show_secret=secret or created, created=created,
        failed=failed.data, health=health, notice=notice, error=error,
        flows=await _flow_choices(p),
    )  # fmt: skip


@router.get("/settings/webhooks/{endpoint_id}")
async def endpoint(endpoint_id: str, p: Page = PageDep) -> Response:
    return await _endpoint_page(p, endpoint_id)


@router.post("/settings/webhooks/{endpoint_id}")
async def endpoint_action(endpoint_id: str, p: Page = PageDep) -> Response:
    fields = await p.form()
    action = first(fields, "action")
    hooks = p.services.webhooks
    try:
        if action == "events":
            await hooks.update_endpoint(
                p.who,
                endpoint_id,
                {
                    "events": fields.get("events", []),
                    "url": first(fields, "url") or None,
                    **_delivery_controls(fields),
                },
            )
            return await _endpoint_page(p, endpoint_id, notice="Saved.")
        if action in ("enable", "disable"):
            await hooks.update_endpoint(p.who, endpoint_id, {"enabled": action == "enable"})
            return await _endpoint_page(
                p, endpoint_id, notice="Enabled." if action == "enable" else "Disabled."
            )
        if action == "delete":
            await hooks.delete_endpoint(p.who, endpoint_id)
            return redirect("/settings/webhooks")
        if action == "reveal":
            return await _endpoint_page(p, endpoint_id, secret=True)
        if action == "rotate":
            await hooks.rotate_secret(p.who, endpoint_id)
            return await _endpoint_page(
                p,
                endpoint_id,
                secret=True,
                notice="New secret made; the old one keeps signing for 24 h.",
            )
        if action == "test":
            await hooks.send_test(p.who, endpoint_id)
            return await _endpoint_page(p, endpoint_id, notice="Test event queued.")
        if action == "recover":
            since = datetime.fromisoformat(first(fields, "since")).replace(tzinfo=UTC)
            done = await hooks.recover(p.who, endpoint_id, since)
            return await _endpoint_page(
                p,
                endpoint_id,
                notice=f"Replaying {len(done.replayed)} failed deliveries ({done.skipped} already delivered).",
            )
    except InvalidInput as exc:
        return await _endpoint_page(p, endpoint_id, error=exc.message, status=400)
    except ValueError:
        return await _endpoint_page(
            p, endpoint_id, error="Pick a date and time to replay from.", status=400
        )
    return await _endpoint_page(p, endpoint_id, error=f"Unknown action {action!r}.", status=400)


# Deliveries


@router.get("/deliveries")
async def deliveries(p: Page = PageDep) -> Response:
    q = p.request.query_params
    status = q.get("status", "failed")
    endpoint_id, event = q.get("endpoint_id") or None, q.get("event") or None
    page_ = await p.services.webhooks.list_deliveries(
        p.who, limit=50, cursor=q.get("cursor") or None, status=status if status != "all" else None,
        endpoint_id=endpoint_id, event=event,
    )  # fmt: skip
    endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
    more = None
    if page_.next_cursor:
        more = "/deliveries?" + urlencode({**dict(q), "cursor": page_.next_cursor})
    return p.render(
        "deliveries.html", rows=page_.data, status=status, endpoint_id=endpoint_id or "", event=event or "",
        endpoints=endpoints, events=EVENT_TYPES, more=more,
    )  # fmt: skip


@router.get("/deliveries/{delivery_id}")
async def delivery(delivery_id: str, p: Page = PageDep) -> Response:
    d, event = await p.services.webhooks.get_delivery(p.who, delivery_id)
    headers = None
    if event is not None:
        sample = build_headers(
            body=event.body, event_id=event.id, event_type=event.type, delivery_id=d.id,
            attempt=max(d.attempts, 1), secret=new_secret(), previous_secret=None,
            now=d.attempt_log[-1].started_at if d.attempt_log else d.created_at,
        )  # fmt: skip
        headers = "\n".join(
            f"{k}: {'(signature)' if 'ignature' in k else v}" for k, v in sample.items()
        )
    return p.render(
        "delivery.html",
        d=d,
        event=event,
        headers=headers,
        notice=p.request.query_params.get("notice"),
    )


@router.post("/deliveries/{delivery_id}/replay")
async def delivery_replay(delivery_id: str, p: Page = PageDep) -> Response:
    await p.form()
    copy = await p.services.webhooks.replay(p.who, delivery_id)
    return redirect(f"/deliveries/{copy.id}?notice=Replay+queued")


# Runs


@router.get("/runs")
async def runs(p: Page = PageDep) -> Response:
    q = p.request.query_params
    status = q.get("status") or None
    page_ = await p.services.runs.list(
        p.who,
        limit=50,
        cursor=q.get("cursor") or None,
        status=status,
        flow_id=q.get("flow_id") or None,
    )
    more = (
        "/runs?" + urlencode({**dict(q), "cursor": page_.next_cursor})
        if page_.next_cursor
        else None
    )
    template = "runs_table.html" if q.get("partial") else "runs.html"
    return p.render(template, rows=page_.data, status=status or "", more=more)


@router.get("/runs/{run_id}")
async def run(run_id: str, p: Page = PageDep) -> Response:
    return await _run_page(p, run_id)


@router.get("/runs/{run_id}/stream")
async def run_stream(run_id: str, p: Page = PageDep) -> Response:
    """The run's events as Server-Sent Events, for its page (the API's stream, signed in
    with the session instead of a key). ``?after=`` is the last event the page was drawn
    with, so the stream starts after it (``Last-Event-ID``, on a reconnect, wins)."""
    last = p.request.headers.get("last-event-id") or p.request.query_params.get("after")
    session = session_hash(p.request.cookies.get(COOKIE, ""))  # signing out ends the stream
    return await open_run_stream(p.request, p.services, p.who, run_id, last, session)


async def _run_page(p: Page, run_id: str, code: int = 200, error: str | None = None) -> Response:
    r = await p.services.runs.get(p.who, run_id)
    events = await p.services.runs.events(p.who, run_id)
    sent = await p.services.webhooks.list_deliveries(p.who, limit=100, cursor=None, run_id=run_id)
    template = "run_body.html" if p.request.query_params.get("partial") else "run.html"
    children = await p.services.runs.children(p.who, run_id)
    names = {c.flow_id: await _flow_name(p, c.flow_id) for c in children.values()}
    tree = _tree(r.steps, _timeline(r, datetime.now(UTC)), r.status if r.status.terminal else None)
    return p.render(
        template,
        code,
        r=r,
        flow_name=await _flow_name(p, r.flow_id),
        tree=tree,
        decidable=_decidable(tree),
        children=children,
        child_flow_names=names,
        events=events,
        deliveries=sent.data,
        notice=p.request.query_params.get("notice"),
        error=error,
        stream_events=" ".join(EVENT_TYPES),
        between_steps=_between_steps(r),
    )


def _between_steps(r: Run) -> bool:
    """Whether the engine is between two of the run's steps: it is running and none of its
    steps is under way. A step that starts to wait (for a signal, a time, a person) has no
    event of its own, so the page, which redraws on events, looks again until one is."""
    return r.status is RunStatus.RUNNING and not any(
        s.depth == 0 and s.status in _UNSETTLED for s in r.steps
    )


async def _flow_name(p: Page, flow_id: str) -> str | None:
    """The flow's name, or ``None`` when it is archived or gone."""
    try:
        return (await p.services.flows.get(p.who, flow_id)).name
    except NotFound:
        return None


def _timeline(r: Run, now: datetime) -> list[tuple[float, float] | None]:
    """Per step record that ran in this run (in the order of ``r.steps``): where its bar
    starts and how wide it is, in percent of the run's time so far, so the page draws the
    steps as a timeline."""
    begin = r.started_at
    if begin is None:
        return [None] * len(r.steps)
    end = r.finished_at or now
    span = max((end - begin).total_seconds(), 1e-3)
    bars: list[tuple[float, float] | None] = []
    for s in r.steps:
        if s.reused or s.started_at is None:
            bars.append(None)
            continue
        left = max(0.0, (s.started_at - begin).total_seconds() / span * 100)
        stop = (s.finished_at or end) - begin
        width = max(0.5, min(100 - left, stop.total_seconds() / span * 100 - left))
        bars.append((round(left, 2), round(width, 2)))
    return bars


@dataclass
class _Node:
    """A step on the run page with its bar and, for a ``parallel`` or ``map`` step, its
    branches or items and how many items stand how."""

    step: RunStep
    bar: tuple[float, float] | None
    groups: list[_Group] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    shown: str = ""
    """The status the page shows: the record's, but a step still waiting or running when
    its run (or its branch or item) ended shows how that ended (see :func:`_stopped`)."""

    def __post_init__(self) -> None:
        self.shown = self.shown or str(self.step.status)


@dataclass
class _Group:
    """A branch or an item on the run page: its steps, and how it stands (see
    :func:`_item_status`)."""

    label: str
    members: list[_Node] = field(default_factory=list)
    status: str = ""


def _tree(
    steps: list[RunStep],
    bars: list[tuple[float, float] | None],
    ended: RunStatus | None = None,
) -> list[_Node]:
    """The run's step records (nested ones after their ``parallel`` or ``map`` step, deeper
    ones after theirs) as a tree: branches by name, items by index. ``ended``: how the run
    ended, if it has."""
    nodes = [_Node(s, b) for s, b in zip(steps, bars, strict=True)]
    top: list[_Node] = []
    stack: list[_Node] = []
    for node in nodes:
        while stack and stack[-1].step.depth >= node.step.depth:
            stack.pop()
        if not stack:
            top.append(node)
        else:
            holder = stack[-1]
            label = _label(node.step.branch, node.step.index)
            if not holder.groups or holder.groups[-1].label != label:
                holder.groups.append(_Group(label))
            holder.groups[-1].members.append(node)
        stack.append(node)
    for node in nodes:
        _settle_groups(node)
    _stopped(top, str(ended) if ended is not None else None)
    return top


_UNSETTLED = frozenset({StepStatus.WAITING, StepStatus.RUNNING, StepStatus.RETRYING})
_ENDED = frozenset({"completed", "failed", "cancelled", "not started"})


def _stopped(members: list[_Node], how: str | None) -> None:
    """Steps whose record still says waiting, running or retrying although what holds them
    (the run, or their branch or item; ``how`` it ended, ``None`` while it goes on) has
    ended: the record stays as the step left it, never run on, and the page says
    ``cancelled`` when their holder was, else ``stopped``."""
    for node in members:
        if how is not None and node.step.status in _UNSETTLED:
            node.shown = "cancelled" if how == "cancelled" else "stopped"
        for group in node.groups:
            _stopped(group.members, group.status if group.status in _ENDED else how)


def _decidable(members: list[_Node]) -> set[str]:
    """The ``approval`` steps the page can decide by step id: those one request waits on. A
    map whose items each wait on the same step has several; each item's request is decided
    through its own approve and reject links."""
    waiting: Counter[str] = Counter()

    def walk(nodes: list[_Node]) -> None:
        for node in nodes:
            if node.step.type == "approval" and node.shown == "waiting":
                waiting[node.step.step_id] += 1
            for group in node.groups:
                walk(group.members)

    walk(members)
    return {step_id for step_id, n in waiting.items() if n == 1}


def _label(branch: str | None, index: int | None) -> str:
    return f"branch {branch}" if branch is not None else f"item {index}"


def _settle_groups(node: _Node) -> None:
    """Give each branch or item of ``node`` its status, list those that ran no step yet too
    (a map's items held back, or never started because the step ended first: they count
    in its total), and count a map's items by status."""
    ran = {g.label: g for g in node.groups}
    if node.step.parts:
        node.groups = []
        for key, status in node.step.parts:
            label = _label(key, None) if isinstance(key, str) else _label(None, key)
            group = ran.get(label) or _Group(label)
            group.status = _item_status(group.members, status)
            node.groups.append(group)
    else:
        for group in node.groups:
            group.status = _item_status(group.members, None)
    if node.step.type == "map":
        for group in node.groups:
            node.counts[group.status] = node.counts.get(group.status, 0) + 1


def _item_status(members: list[_Node], part: RunStatus | None) -> str:
    """How an item (or branch) stands: as its part ended (``completed``, ``failed``,
    ``cancelled``, or ``not started`` when it was cancelled before it ran a step),
    ``queued`` while it has not started; else, from its steps, failed if one failed,
    ``waiting`` if one waits, else ``running``. Without its part (``None``), completed when
    every step is."""
    if part is RunStatus.CANCELLED and not members:
        return "not started"
    if part is not None and part.terminal:
        return str(part)
    if not members:
        return "running" if part is RunStatus.RUNNING else "queued"
    statuses = {m.step.status for m in members}
    if StepStatus.FAILED in statuses:
        return "failed"
    if part is None and statuses <= {StepStatus.COMPLETED, StepStatus.SKIPPED}:
        return "completed"
    return "waiting" if StepStatus.WAITING in statuses else "running"


@router.post("/runs/{run_id}/cancel")
async def run_cancel(run_id: str, p: Page = PageDep) -> Response:
    await p.form()
    await p.services.runs.cancel(p.who, run_id)
    return redirect(f"/runs/{run_id}?notice=Cancel+requested")


@router.post("/runs/{run_id}/steps/{step_id}/decide")
async def run_decide(run_id: str, step_id: str, p: Page = PageDep) -> Response:
    """Approve or reject a run's ``approval`` step from its page."""
    fields = await p.form()
    approve = first(fields, "decision") == "approve"
    try:
        await p.services.approvals.decide(
            p.who, run_id, step_id, approve=approve, comment=first(fields, "comment") or None,
            by=f"the settings screen (key {p.who.key_id})",
        )  # fmt: skip
    except (Conflict, InvalidInput) as exc:
        return await _run_page(p, run_id, 409 if isinstance(exc, Conflict) else 400, exc.message)
    notice = f"Step {step_id} {'approved' if approve else 'rejected'}"
    return redirect(f"/runs/{run_id}?" + urlencode({"notice": notice}))


@router.post("/runs/{run_id}/rerun")
async def run_rerun(run_id: str, p: Page = PageDep) -> Response:
    """Rerun from the step the form names (``from_step``), or from the first step with no
    result; a refusal (a step before it has no result) shows on the run's page."""
    fields = await p.form()
    from_step = first(fields, "from_step") or None
    try:
        started = await p.services.runs.rerun(p.who, run_id, from_step=from_step)
    except InvalidInput as exc:
        return await _run_page(p, run_id, 400, f"Cannot rerun: {exc.message}")
    where = f"step {from_step}" if from_step else "its first unfinished step"
    notice = f"Rerun of {run_id} from {where}"
    return redirect(f"/runs/{started.run.run_id}?" + urlencode({"notice": notice}))


# Flows


@router.get("/flows")
async def flows(p: Page = PageDep) -> Response:
    page_ = await p.services.flows.list(p.who, limit=100, cursor=None)
    return p.render("flows.html", rows=page_.data)


@router.get("/flows/{flow_id}")
async def flow(flow_id: str, p: Page = PageDep) -> Response:
    f = await p.services.flows.get(p.who, flow_id, _version(p.request.query_params.get("version")))
    versions = await p.services.flows.versions(p.who, flow_id)
    return p.render("flow.html", f=f, versions=versions, error=None, payload="{\n  \n}")


_MAX_VERSION = 2_000_000_000  # as the API's ?version= (fits every backend's integer)


def _version(text: str | None) -> int | None:
    """``?version=N``: absent or empty is the current version; anything but 1 to 2e9 in
    ASCII digits is refused (``str.isdigit`` takes "²", which ``int`` does not)."""
    if not text:
        return None
    digits = len(text) <= 10 and text.isascii() and text.isdigit()  # int() of 5,000 digits raises
    if not digits or not 1 <= int(text) <= _MAX_VERSION:
        raise InvalidInput(f"version must be a whole number from 1 to {_MAX_VERSION}")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _payload(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(payload, None) for a JSON object the store can write back as it is, else
    (None, what is wrong with it)."""
    try:
        payload = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return None, (
            f"The payload is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        )
    except ValueError as exc:  # NaN, Infinity
        return None, f"The payload is not valid JSON: {exc}."
    except RecursionError:
        return None, "The payload nests too deeply."
    if not isinstance(payload, dict):
        return None, 'The payload must be a JSON object, such as {"order_id": "ord_123"}.'
    try:
        orjson.dumps(payload)  # what the store writes: 64-bit integers, bounded nesting
    except orjson.JSONEncodeError as exc:
        reason = str(exc)
        if "64-bit" in reason:
            return None, "The payload holds an integer too large to store (at most 64 bits)."
        if "ecursion" in reason:
            return None, "The payload nests too deeply to store (keep it under 250 levels)."
        return None, f"The payload cannot be stored: {reason}."
    return payload, None


@router.post("/flows/{flow_id}/start")
async def flow_start(flow_id: str, p: Page = PageDep) -> Response:
    fields = await p.form()
    text = first(fields, "payload", "{}") or "{}"
    payload, error = _payload(text)
    if payload is not None:
        started = await p.services.runs.start(p.who, flow_id=flow_id, payload=payload)
        return redirect(f"/runs/{started.run.run_id}")
    f = await p.services.flows.get(p.who, flow_id)
    versions = await p.services.flows.versions(p.who, flow_id)
    return p.render("flow.html", 400, f=f, versions=versions, error=error, payload=text)
