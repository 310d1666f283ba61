"""Event streams (issue 17): how soon a committed event reaches a client of a stream.

    .venv/bin/python bench/stream.py                                  # both backends
    .venv/bin/python bench/stream.py --backends sqlite --duration 5 --streams 50

A real `flowhook serve` on a fresh database (as bench/suite.py starts it); ``--streams``
clients follow ``GET /api/v1/events/stream``; runs of the three-transform flow are started
open loop at ``--rate`` runs/s for ``--duration`` s (five events each), and meanwhile a probe
event is committed every ``--probe-every`` s by "send a test event" (the API answers once
its transaction committed). Two figures per backend, p50 and p99:

- committed → received: from the moment the probe's request is sent (before its commit, so
  an upper bound by the request's own handling) to its arrival on a stream, over every
  stream; and, a lower bound, from the request's answer (after the commit) to the arrival
  (it may be negative: a stream can be told before the answer leaves). The request alone is
  printed too. The issue's target: p50 ≤ 20 ms, p99 ≤ 100 ms at 200 runs/s.
- made → received for the runs' own events: from the event id's millisecond (taken when the
  engine makes the event, before the step's or run's transaction commits, sometimes well
  before: the engine commits a run's progress in batches) to its arrival.

It checks that every stream received every event of the runs and every probe (exit 1 when
one is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from harness import Receiver, client, create_flow, percentile, running_server, subscribe

from flowhook.ids import id_millis


class Stream:
    """One client's stream: when each event id arrived (time.time(), ms)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.arrived: dict[str, float] = {}

    async def follow(self, http: aiohttp.ClientSession) -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        async with http.get("/api/v1/events/stream", timeout=timeout) as r:
            if r.status != 200:
                raise RuntimeError(f"stream answered {r.status}: {await r.text()}")
            self.ready.set()
            async for line in r.content:
                if line.startswith(b"id: "):
                    self.arrived[line[4:].strip().decode()] = time.time() * 1000


async def probes(
    http: aiohttp.ClientSession, endpoint: str, every: float, until: float
) -> dict[str, float]:
    """Test events committed by the API until ``until`` (perf_counter): id → sent at (ms)."""
    sent: dict[str, float] = {}
    while time.perf_counter() < until:
        at = time.time() * 1000
        async with http.post(f"/api/v1/webhooks/endpoints/{endpoint}/test") as r:
            if r.status != 202:
                raise RuntimeError(f"test event answered {r.status}: {await r.text()}")
            sent[(await r.json())["id"]] = at
        answered = time.time() * 1000
        ANSWERED[next(reversed(sent))] = answered
        await asyncio.sleep(every)
    return sent


ANSWERED: dict[str, float] = {}
"""When each probe's answer arrived (ms): after its commit."""


async def measure(server: object, args: argparse.Namespace) -> dict[str, float]:
    async with Receiver() as receiver, client(server, args.streams + 64) as http:  # type: ignore[arg-type]
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.approval_requested"])  # only the probes go there
        async with http.get("/api/v1/webhooks/endpoints") as r:
            endpoint = (await r.json())["data"][0]["id"]
        streams = [Stream() for _ in range(args.streams)]
        readers = [asyncio.create_task(s.follow(http)) for s in streams]
        await asyncio.gather(*(s.ready.wait() for s in streams))
        count = max(1, round(args.rate * args.duration))
        begin = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, begin + i / args.rate - time.perf_counter()))
            body = {"flow_id": flow_id, "payload": {"n": i}}
            async with http.post("/api/v1/flows/execute", json=body) as r:
                if r.status != 202:
                    raise RuntimeError(f"execute answered {r.status}: {await r.text()}")

        probing = asyncio.create_task(
            probes(http, endpoint, args.probe_every, begin + args.duration)
        )
        await asyncio.gather(*(one(i) for i in range(count)))
        sent = await probing
        expected = count * 5 + len(sent)  # each run: started, three steps, completed
        deadline = time.monotonic() + 60
        while min(len(s.arrived) for s in streams) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    committed = [s.arrived[i] - at for s in streams for i, at in sent.items() if i in s.arrived]
    answered = [s.arrived[i] - ANSWERED[i] for s in streams for i in sent if i in s.arrived]
    made = [at - id_millis(i) for s in streams for i, at in s.arrived.items() if i not in sent]
    return {
        "probes": len(sent),
        "events": expected,
        "streams_short": sum(1 for s in streams if len(s.arrived) < expected),
        "p50": percentile(committed, 50),
        "p99": percentile(committed, 99),
        "answer_p50": percentile([ANSWERED[i] - at for i, at in sent.items()], 50),
        "after_p50": percentile(answered, 50),
        "after_p99": percentile(answered, 99),
        "made_p50": percentile(made, 50),
        "made_p99": percentile(made, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--rate", type=float, default=200.0, help="runs started per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--streams", type=int, default=10, help="clients following the stream")
    parser.add_argument("--probe-every", type=float, default=0.02, help="seconds between probes")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "FLOWHOOK_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    failed = False
    print(
        f"{args.streams} streams, {args.rate:g} runs/s for {args.duration:g} s "
        f"and a probe every {args.probe_every:g} s"
    )
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        env = {"FLOWHOOK_MAX_STREAMS_PER_KEY": str(args.streams + 10)}
        with running_server(backend, args.postgres_url, **env) as server:
            figures = asyncio.run(measure(server, args))
        verdict = "met" if figures["p50"] <= 20 and figures["p99"] <= 100 else "not met"
        print(
            f"{backend:>10}: committed → received p50 {figures['p50']:.1f} ms, p99 "
            f"{figures['p99']:.1f} ms ({figures['probes']:.0f} probes × {args.streams} streams; "
            f"target p50 ≤ 20, p99 ≤ 100: {verdict}; the probe's request alone p50 "
            f"{figures['answer_p50']:.1f} ms; from its answer, after the commit, to the stream "
            f"p50 {figures['after_p50']:.1f} ms, p99 {figures['after_p99']:.1f} ms); "
            f"runs' events made → received p50 "
            f"{figures['made_p50']:.1f} ms, p99 {figures['made_p99']:.1f} ms "
            f"({figures['events']:.0f} events per stream)"
        )
        if figures["streams_short"]:
            print(f"{backend:>10}: {figures['streams_short']:.0f} streams missed events")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
