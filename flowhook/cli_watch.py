"""Following a run from the CLI over its event stream: ``runs watch`` (a live table of its
steps, or a line per event without a terminal) and ``runs start --wait``.

Events say when a step ends, fails, retries or asks for approval, and when the run ends; a
step that starts running or waiting (a ``wait``, ``delay`` or ``flow`` step) raises none, so
when the stream has been quiet a while the run record is read once more. A server older than
the stream (404 for its path) is followed as before, by long-polling the run."""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flowhook.client import (
    APIError,
    Client,
    FlowhookClientError,
    Run,
    Step,
    StreamError,
    StreamEvent,
)

__all__ = [
    "EventFeed",
    "Board",
    "event_line",
    "follow",
    "print_step",
    "waiting_line",
    "wait_quietly",
    "watch",
]

QUIET = 2.0
"""Seconds without an event after which the run record is read (what a step waits for)."""

STYLES = {
    "completed": "green",
    "failed": "red",
    "cancelled": "red",
    "retrying": "yellow",
    "waiting": "yellow",
    "running": "cyan",
    "queued": "dim",
    "skipped": "dim",
}


class EventFeed:
    """A run's stream read on a thread of its own, so the CLI can wait for events with a
    timeout (to redraw, or to read the run when the stream is quiet)."""

    def __init__(self, client: Client, run_id: str) -> None:
        self._items: queue.SimpleQueue[StreamEvent | Exception | None] = queue.SimpleQueue()
        self._error: Exception | None = None
        self.ended = False
        """The stream is over: it ended after the run's terminal event."""
        self.seen = 0
        reader = threading.Thread(
            target=self._read, args=(client, run_id), name=f"stream {run_id}", daemon=True
        )
        reader.start()

    def _read(self, client: Client, run_id: str) -> None:
        try:
            for event in client.stream(run_id):
                self._items.put(event)
        except Exception as exc:  # noqa: BLE001 - any, else the reader waits forever
            # take() raises it in the thread that waits for events
            self._items.put(exc)
        else:
            self._items.put(None)

    def take(self, timeout: float) -> list[StreamEvent]:
        """The events that came, waiting up to ``timeout`` s for the first; raises what
        stopped the stream (once the events before it are handed over)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self.ended:
            time.sleep(timeout)
            return []
        out: list[StreamEvent] = []
        try:
            item = self._items.get(timeout=timeout)
            while item is not None and not isinstance(item, Exception):
                out.append(item)
                item = self._items.get_nowait()
            if item is None:
                self.ended = True
            else:
                self._error = item
        except queue.Empty:
            pass
        self.seen += len(out)
        return out if out or self._error is None else self.take(0)

    def unsupported(self, exc: Exception) -> bool:
        """``exc`` says the server has no stream of runs (it is older): 404 or 405 for the
        path, before any event."""
        return isinstance(exc, APIError) and exc.status in (404, 405) and self.seen == 0

    def poll_instead(self, exc: Exception) -> bool:
        """Follow the run by reading it instead: the server has no stream, or the stream
        kept dropping (the run record still answers what the CLI needs)."""
        return self.unsupported(exc) or isinstance(exc, StreamError)


def _ms(value: Any) -> str:
    if value is None:
        return ""
    ms = int(value)
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _since(started_at: str | None) -> str:
    """How long a step has been running or waiting, from its start."""
    if not started_at:
        return ""
    try:
        start = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        return ""
    return _ms(max(0, (datetime.now(UTC) - start).total_seconds() * 1000)) + "…"


@dataclass(frozen=True, slots=True)
class Row:
    step_id: str
    type: str
    status: str
    duration_ms: int | None = None
    started_at: str | None = None
    parent: str | None = None
    branch: str | None = None
    index: int | None = None

    @classmethod
    def of(cls, step: Step) -> Row:
        """The row of a step of the run record (a map item's or a branch's, too)."""
        return cls(
            step["id"], step["type"], step["status"], step.get("duration_ms"),
            step.get("started_at"), step.get("parent"), step.get("branch"), step.get("index"),
        )  # fmt: skip

    @property
    def key(self) -> tuple[str | None, str | None, int | None, str]:
        """Which step this is: a nested step's id is the same in every item and branch."""
        return (self.parent, self.branch, self.index, self.step_id)

    @property
    def where(self) -> str:
        """A nested step's place, as the run record names it: branch or (map) index."""
        if self.branch is not None:
            return f"branch {self.branch}"
        return f"index {self.index}" if self.index is not None else ""


class Board:
    """The steps of a run as a table: loaded from the run record, then moved on by events."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.rows: dict[tuple[str | None, str | None, int | None, str], Row] = {}
        self.load(run)

    def load(self, run: Run) -> None:
        """The run record's steps replace what events said (the record knows more: steps
        running, waiting or skipped)."""
        self.run = run
        self.rows = {}
        for step in run.steps:
            row = Row.of(step)
            self.rows[row.key] = row

    def apply(self, event: StreamEvent) -> None:
        p = event.payload
        if event.event in ("flow.step_completed", "flow.step_failed"):
            status = "completed" if event.event == "flow.step_completed" else "failed"
            if status == "failed" and p.get("will_retry"):
                status = "retrying"
            row = Row(
                str(p.get("step_id")), str(p.get("type")), status, p.get("duration_ms"),
                None, p.get("parent"), p.get("branch"), p.get("index"),
            )  # fmt: skip
            self.rows[row.key] = row
        elif event.event == "flow.approval_requested":
            step_id = str(p.get("step_id"))
            found = [r for r in self.rows.values() if r.step_id == step_id]
            row = found[-1] if found else Row(step_id, "approval", "waiting")
            self.rows[row.key] = replace(row, status="waiting", duration_ms=None)
        elif event.event == "flow.started":
            self.run = replace(self.run, status="running", started_at=event.timestamp)
        elif event.terminal:
            status = str(p.get("status") or event.event.removeprefix("flow."))
            self.run = replace(self.run, status=status, duration_ms=p.get("duration_ms"))

    def render(self) -> RenderableType:
        run = self.run
        style = STYLES.get(run.status, "")
        took = _ms(run.duration_ms) if run.terminal else _since(run.started_at)
        title = Text.assemble(
            (run.run_id, "bold"), f"  flow {run.flow_id}  ", (run.status, style), f"  {took}"
        )
        nested = any(r.parent is not None for r in self.rows.values())
        table = Table("step", "type", "status", "duration")
        if nested:
            table.add_column("parent")
            table.add_column("branch/index")
        for row in self.rows.values():
            done = row.status in ("completed", "failed", "skipped") or row.duration_ms is not None
            cells: list[str | Text] = [
                row.step_id,
                row.type,
                Text(row.status, STYLES.get(row.status, "")),
                _ms(row.duration_ms) if done else _since(row.started_at),
            ]
            if nested:
                cells += [row.parent or "", row.where]
            table.add_row(*cells)
        if not self.rows:
            return Group(title, table, Text("no steps yet", "dim"))
        return Group(title, table)


def event_line(event: StreamEvent) -> str:
    """One line of text about ``event`` (``runs watch`` without a terminal)."""
    p = event.payload
    at = (event.timestamp or "")[11:23]
    where = ""
    if p.get("parent") is not None:
        place = f"[{p['branch']}]" if "branch" in p else f"[{p.get('index')}]"
        where = f" in {p['parent']}{place}"
    if event.event in ("flow.step_completed", "flow.step_failed"):
        status = "completed" if event.event == "flow.step_completed" else "failed"
        if status == "failed" and p.get("will_retry"):
            status = "retrying"
        error = p.get("error") or {}
        detail = f": {error.get('message')}" if isinstance(error, dict) and error else ""
        took = f" {_ms(p.get('duration_ms'))}" if p.get("duration_ms") is not None else ""
        text = f"{p.get('step_id')}{where} {p.get('type')} {status}{took}{detail}"
    elif event.event == "flow.approval_requested":
        text = f"{p.get('step_id')} waiting for approval: {p.get('message')}"
    elif event.event == "flow.started":
        text = f"running (trigger {p.get('trigger')}, version {p.get('flow_version')})"
    elif event.terminal:
        error = p.get("error") or {}
        detail = f": {error.get('message')}" if isinstance(error, dict) and error else ""
        text = f"{p.get('status')} in {p.get('duration_ms')} ms{detail}"
    else:
        text = json.dumps(p, default=str)
    return f"{at} {event.event} {text}".strip()


def print_step(console: Console, step: Step) -> None:
    mark = {
        "completed": "[green]✓[/green]",
        "failed": "[red]✗[/red]",
        "skipped": "[dim]-[/dim]",
    }.get(step["status"], "[yellow]…[/yellow]")
    took = f"{step['duration_ms']} ms" if step.get("duration_ms") is not None else ""
    reused = " (reused)" if step.get("reused") else ""
    row = Row.of(step)
    place = f" [dim]({row.parent} {row.where})[/dim]" if row.parent is not None else ""
    console.print(
        f"  {mark} {step['id']}{place} [dim]{step['type']} {step['status']}{reused} {took}[/dim]"
        + _waiting_for(step)
    )


def _waiting_for(step: Step) -> str:
    """What a waiting step waits for, and until when."""
    output = step.get("output") or {}
    if step["status"] != "waiting" or not isinstance(output, dict):
        return ""
    until = f" until {output['until']}" if output.get("until") else ""
    if step["type"] == "wait":
        match = ", ".join(f"{k}={json.dumps(v)}" for k, v in (output.get("match") or {}).items())
        return f" [yellow]for signal {output.get('signal')}{f' ({match})' if match else ''}{until}[/yellow]"
    if step["type"] == "flow":
        return f" [yellow]for child run {output.get('run_id')}{until}[/yellow]"
    if step["type"] == "approval":
        message = escape(str(output.get("message") or "a decision"))
        return f" [yellow]for approval: {message}{until}[/yellow]"
    return f" [yellow]{until.strip()}[/yellow]" if until else ""


def waiting_line(why: dict[str, Any] | None) -> str:
    """A run's ``waiting_for`` in words, or ``""``."""
    if not why:
        return ""
    reason = why.get("reason")
    until = f" until {why['until']}" if why.get("until") else ""
    step = f" in step {why['step_id']}" if why.get("step_id") else ""
    key = f" for key {why['key']!r}" if why.get("key") else ""
    text = {
        "worker": f"for an engine worker to take it (queued since {why.get('since')})",
        "concurrency": f"for a concurrency slot{key}"
        + (f", held by {', '.join(why['held_by'])}" if why.get("held_by") else ""),
        "throttle": f"for the throttle{key}{until}",
        "debounce": f"for the debounce{key} to settle",
        "delay": f"for the delay{step}{until}",
        "retry": f"to retry{step} (attempt {why.get('attempt')}){until}",
        "signal": f"for the signal {why.get('name')}{step}{until}",
        "approval": f"for an approval{step}{until}",
        "child": f"for the child run {why.get('run_id')}{step}",
        "parts": f"for its parts{step}: "
        + ", ".join(f"{n} {s}" for s, n in (why.get("parts") or {}).items()),
        "task": f"for the task {why.get('task')}{step}: "
        + (
            f"worker {why['worker_id']} runs attempt {why.get('attempt')}"
            if why.get("worker_id")
            else "no worker runs it (flowhook tasks serve)"
            if why.get("no_worker")
            else "waiting to be claimed"
        ),
    }.get(str(reason), str(reason))
    return f"waiting {escape(text)}"


def follow(c: Client, run_id: str, timeout: float, console: Console) -> Run:
    """Print steps as they finish or start waiting, and why the run waits whenever that
    changes (``waiting_for``), until the run ends or ``timeout`` s pass: the run is read on each event of its stream and after ``QUIET`` s without one
    (long-polled 2 s at a time from a server without streams, or once the stream gave up)."""
    shown: dict[tuple[str | None, str | None, int | None, str], str] = {}
    said = ""  # why it waits, as last printed
    deadline = time.monotonic() + timeout
    feed: EventFeed | None = EventFeed(c, run_id)
    while True:
        run = c.get_run(run_id) if feed is not None else c.get_run(run_id, wait=2)
        for step in run.steps:
            key = Row.of(step).key  # each map item and branch its own, as runs watch has it
            if shown.get(key) != step["status"] and step["status"] not in ("running",):
                shown[key] = step["status"]
                print_step(console, step)
        waiting = "" if run.terminal else waiting_line(run.raw.get("waiting_for"))
        if waiting and waiting != said:
            console.print(f"  [yellow]{waiting}[/yellow]")
        said = waiting
        left = deadline - time.monotonic()
        if run.terminal or left < 0:
            return run
        if feed is not None:
            try:
                feed.take(min(QUIET, left))
            except (APIError, StreamError) as exc:
                if not feed.poll_instead(exc):
                    raise
                feed = None


def wait_quietly(c: Client, run_id: str, timeout: float) -> Run:
    """The run once it has ended (its stream's terminal event), within ``timeout`` s;
    :class:`FlowhookClientError` if it has not. A server without streams (or a stream that
    gave up) is polled every 0.5 s."""
    deadline = time.monotonic() + timeout
    feed = EventFeed(c, run_id)
    while (left := deadline - time.monotonic()) > 0:
        try:
            events = feed.take(min(left, 30.0))
        except (APIError, StreamError) as exc:
            if not feed.poll_instead(exc):
                raise
            return c.wait(run_id, interval=0.5, max_attempts=int(left / 0.5) + 1)
        # quiet for 30 s: a look at the run costs little and ends a wait on a lost stream
        if any(e.terminal for e in events) or not events or feed.ended:
            run = c.get_run(run_id)
            if run.terminal:
                return run
    run = c.get_run(run_id)
    if run.terminal:
        return run
    raise FlowhookClientError(f"run {run_id} was still {run.status} after {timeout:g} s")


def watch(c: Client, run_id: str, console: Console) -> Run:
    """``runs watch``: a live table of the run's steps on a terminal, else a line per event;
    answers the ended run."""
    run = c.get_run(run_id)
    feed = EventFeed(c, run_id)
    if console.is_terminal:
        return _live(c, Board(run), feed, console)
    while not feed.ended:
        try:
            events = feed.take(30.0)
        except APIError as exc:
            if not feed.unsupported(exc):
                raise
            return follow(c, run_id, float("inf"), console)
        for event in events:
            console.print(event_line(event), markup=False, highlight=False, soft_wrap=True)
    return c.get_run(run_id)


def _live(c: Client, board: Board, feed: EventFeed | None, console: Console) -> Run:
    """The live table, redrawn as events come (and twice a second for the clocks)."""
    quiet_since = time.monotonic()
    with Live(board.render(), console=console, auto_refresh=False) as live:
        while not board.run.terminal:
            if feed is None:
                board.load(c.get_run(board.run.run_id, wait=2))
                live.update(board.render(), refresh=True)
                continue
            try:
                events = feed.take(0.5)
            except (APIError, StreamError) as exc:
                if not feed.poll_instead(exc):
                    raise
                feed = None
                continue
            for event in events:
                board.apply(event)
            now = time.monotonic()
            if events:
                quiet_since = now
            if board.run.terminal or feed.ended or now - quiet_since >= QUIET:
                board.load(c.get_run(board.run.run_id))
                quiet_since = now
            live.update(board.render(), refresh=True)
    return board.run
