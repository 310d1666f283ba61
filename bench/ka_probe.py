"""Why the suite's client saw reset connections (issue 18): a keep-alive race.

    .venv/bin/python bench/ka_probe.py [--rounds 16]

A real `flowhook serve` on SQLite; bursts of 64 executes over 64 pooled connections, each
burst after an idle gap of about 5 s, the time uvicorn keeps an idle keep-alive connection.
With aiohttp's default (an idle connection kept 15 s), some requests of a burst go out on a
connection the server is closing at that moment and come back reset (``ClientOSError:
Connection reset by peer``, ``ServerDisconnectedError``); with the harness's client
(idle connections dropped after ``harness.KEEPALIVE`` = 4 s) none do. It prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from harness import KEEPALIVE, Server, create_flow, running_server

GAPS = (4.95, 4.99, 5.0, 5.01, 5.03, 4.98, 5.0, 5.02)


async def _probe(server: Server, keepalive: float | None, rounds: int) -> tuple[int, Counter[str]]:
    errors: Counter[str] = Counter()
    ok = 0
    options = {} if keepalive is None else {"keepalive_timeout": keepalive}
    connector = aiohttp.TCPConnector(limit=64, **options)  # type: ignore[arg-type]
    async with aiohttp.ClientSession(
        base_url=server.base, headers=server.auth, connector=connector
    ) as http:
        flow_id = await create_flow(http)

        async def one() -> None:
            nonlocal ok
            try:
                body = {"flow_id": flow_id, "payload": {}}
                async with http.post("/api/v1/flows/execute", json=body) as r:
                    await r.read()
                    ok += 1
            except aiohttp.ClientError as exc:
                errors[f"{type(exc).__name__}: {exc}"[:70]] += 1

        for i in range(rounds):
            await asyncio.gather(*(one() for _ in range(64)))
            await asyncio.sleep(GAPS[i % len(GAPS)])
    return ok, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=16, help="bursts of 64 executes")
    args = parser.parse_args()
    with running_server("sqlite", "") as server:
        for label, keepalive in (("aiohttp default (15 s)", None), (f"{KEEPALIVE:g} s", KEEPALIVE)):
            ok, errors = asyncio.run(_probe(server, keepalive, args.rounds))
            print(
                f"client keep-alive {label}: {ok} answered, {sum(errors.values())} reset {dict(errors)}"
            )


if __name__ == "__main__":
    main()
