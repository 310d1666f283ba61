"""One tenant attacks, another runs a one-step flow: how long does the quiet one wait?

Issue 50 (security, second audit): with one tenant running the audit's attacks, another
tenant's one-step run should stay under 1 s from accept to completed, on both backends. A
real `flowhook serve` per backend; tenant ``noisy`` runs, at once and for ``--duration`` s:

- the self-calling tree: a flow that calls itself (``wait: false``) from a 4-item map, started
  once (its tree stops at ``FLOWHOOK_MAX_RUN_TREE``);
- the 132 KB definition: 60 steps of one 150-term expression each, saved in a loop (each
  refused at once now);
- slow flow-control keys: executes of a flow whose concurrency key runs in the expression
  thread, 16 at a time;
- 20 readers of a large run's stream that read nothing.

Tenant ``quiet`` executes a one-step flow every ``--every`` s and long-polls its run until it
completes: accept-to-completed p50, p99 and the worst are printed per backend, with the
same measured on an idle server first (the reference, in the same run).

    .venv/bin/python bench/noisy_neighbour.py --backends sqlite,postgresql --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import FLOWHOOK, Server, percentile, running_server

ONE_STEP = {"name": "quiet", "steps": [{"id": "a", "type": "transform", "output": {"ok": True}}]}


def _key(server: Server, workspace: str) -> str:
    made = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", workspace, "--json"],
        env=server.environment(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return str(json.loads(made.stdout)["key"])


async def _post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with s.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


class Quiet:
    """The quiet tenant's runs: accept-to-completed of each (``inf``: refused), and where
    the time went: the execute's answer, queued to started and started to finished (the
    server's own timestamps), and finished to seen by the long poll."""

    def __init__(self) -> None:
        self.took: list[float] = []
        self.parts: dict[str, list[float]] = {
            "accept": [], "queued→started": [], "started→finished": [], "finished→seen": []
        }  # fmt: skip


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


POLL = 0.0
"""Seconds between plain reads of a quiet run (``--poll``); 0: one long poll after another."""


async def _quiet(base: str, key: str, seconds: float, every: float) -> Quiet:
    """One-step runs, one every ``every`` s for ``seconds`` s, each long-polled until done
    (or read every ``POLL`` s)."""
    quiet = Quiet()
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(base, headers=headers) as s:
        _, flow = await _post(s, "/api/v1/flows", ONE_STEP)

        async def one() -> None:
            start = time.monotonic()
            status, accepted = await _post(
                s, "/api/v1/flows/execute", {"flow_id": flow["flow_id"], "payload": {}}
            )
            if status != 202:
                quiet.took.append(float("inf"))
                return
            quiet.parts["accept"].append(time.monotonic() - start)
            while True:
                wait = {} if POLL else {"wait": "30"}
                async with s.get(f"/api/v1/flows/runs/{accepted['run_id']}", params=wait) as r:
                    run = await r.json()
                if POLL and run["status"] not in ("completed", "failed", "cancelled"):
                    await asyncio.sleep(POLL)
                if run["status"] in ("completed", "failed", "cancelled"):
                    seen = time.time()
                    quiet.took.append(time.monotonic() - start)
                    if run["started_at"] and run["finished_at"]:
                        queued, started = _at(run["queued_at"]), _at(run["started_at"])
                        finished = _at(run["finished_at"])
                        quiet.parts["queued→started"].append(started - queued)
                        quiet.parts["started→finished"].append(finished - started)
                        quiet.parts["finished→seen"].append(seen - finished)
                    return

        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(every)
        await asyncio.gather(*tasks)
    return quiet


ATTACKS = ("tree", "heavy", "keys", "readers")


async def _attacks(base: str, key: str, stop: asyncio.Event, which: set[str]) -> dict[str, int]:
    counts = {"tree_started": 0, "heavy_saves": 0, "slow_keys": 0, "idle_readers": 0}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(base, headers=headers) as s:
        # the self-calling tree
        _, bomb = await _post(s, "/api/v1/flows", ONE_STEP | {"name": "bomb"})
        call = {"id": "again", "type": "flow", "flow_id": bomb["flow_id"], "wait": False}
        fan = {"id": "each", "type": "map", "items": "{{ [1, 2, 3, 4] }}", "steps": [call]}
        async with s.put(f"/api/v1/flows/{bomb['flow_id']}", json={"name": "bomb", "steps": [fan]}):
            pass
        if "tree" in which:
            await _post(s, "/api/v1/flows/execute", {"flow_id": bomb["flow_id"], "payload": {}})
            counts["tree_started"] = 1
        # a large run for the idle readers
        big = [
            {
                "id": f"s{i}",
                "type": "transform",
                "output": {k: f"{{{{ '{k}' * 90000 }}}}" for k in "ab"},
            }
            for i in range(20)
        ] + [{"id": "hold", "type": "wait", "signal": "never"}]
        _, large = await _post(s, "/api/v1/flows", {"name": "large", "steps": big})
        _, run = await _post(
            s, "/api/v1/flows/execute", {"flow_id": large["flow_id"], "payload": {}}
        )
        readers = []
        host, port = base.removeprefix("http://").split(":")
        for _ in range(20 if "readers" in which else 0):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            sock.sendall(
                f"GET /api/v1/flows/runs/{run['run_id']}/stream HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {key}\r\n\r\n".encode()
            )
            readers.append(sock)
        counts["idle_readers"] = len(readers)
        # slow keys
        paced = {"name": "paced", "steps": ONE_STEP["steps"],
                 "concurrency": {"limit": 1000, "key": "{{ (range(20000) | sum) ~ payload.k }}"}}  # fmt: skip
        _, paced_flow = await _post(s, "/api/v1/flows", paced)
        heavy = {
            "name": "heavy",
            "steps": [
                {"id": f"h{i}", "type": "transform",
                 "output": {"v": "{{ " + " + ".join(f"payload.a{t}" for t in range(150)) + " }}"}}
                for i in range(60)
            ],
        }  # fmt: skip

        async def keys_loop() -> None:
            while "keys" in which and not stop.is_set():
                await asyncio.gather(*(
                    _post(s, "/api/v1/flows/execute", {"flow_id": paced_flow["flow_id"], "payload": {"k": i}})
                    for i in range(16)
                ))  # fmt: skip
                counts["slow_keys"] += 16

        async def heavy_loop() -> None:
            while "heavy" in which and not stop.is_set():
                await _post(s, "/api/v1/flows", heavy)
                counts["heavy_saves"] += 1

        await asyncio.gather(keys_loop(), heavy_loop())
        for sock in readers:
            with contextlib.suppress(OSError):
                sock.close()
    return counts


def _summary(label: str, quiet: Quiet) -> str:
    took = quiet.took
    done = [t for t in took if t != float("inf")]
    refused = len(took) - len(done)
    if not done:
        return f"{label}: no run completed ({refused} refused)"
    parts = ", ".join(
        f"{name} {percentile(values, 50) * 1000:.0f}"
        for name, values in quiet.parts.items()
        if values
    )
    return (
        f"{label}: {len(done)} runs, accept→completed p50 {percentile(done, 50) * 1000:.0f} ms, "
        f"p99 {percentile(done, 99) * 1000:.0f} ms, worst {max(done) * 1000:.0f} ms"
        + (f", {refused} refused" if refused else "")
        + f"\n    p50 of its parts, ms: {parts}"
    )


async def _measure(
    server: Server, seconds: float, every: float, which: set[str]
) -> tuple[Quiet, Quiet, dict[str, int]]:
    quiet_key, noisy_key = _key(server, "quiet"), _key(server, "noisy")
    idle = await _quiet(server.base, quiet_key, min(seconds, 10.0), every)
    stop = asyncio.Event()
    attacks = asyncio.create_task(_attacks(server.base, noisy_key, stop, which))
    await asyncio.sleep(1.0)  # the attacks under way
    loaded = await _quiet(server.base, quiet_key, seconds, every)
    stop.set()
    counts = await attacks
    return idle, loaded, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds under attack")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between quiet runs")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="which attacks to run")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "FLOWHOOK_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=0.0,
        help="read each quiet run every this many s instead of long-polling it (where the "
        "time after it finished goes: the engine's commit, or the wake-up)",
    )
    args = parser.parse_args()
    global POLL
    POLL = args.poll
    for backend in args.backends.split(","):
        with running_server(backend, args.postgres_url) as server:
            which = set(args.attacks.split(","))
            idle, loaded, counts = asyncio.run(_measure(server, args.duration, args.every, which))
        print(f"== {backend}")
        print("  " + _summary("idle server (reference)", idle))
        print("  " + _summary("under attack", loaded))
        print(f"  attacks: {counts}")
        worst = max(loaded.took) if loaded.took else float("inf")
        print(f"  under 1 s throughout: {'yes' if worst < 1.0 else 'NO'}")


if __name__ == "__main__":
    main()
