"""Accept benchmark: POST /api/v1/flows/execute under load, against a real `flowhook serve`.

Runs wrk (Debian package `wrk`) with a Lua body against a fresh server, repeats, and prints
runs/s accepted (202) with p50 and p99 latency, and the median of the repeats.

    .venv/bin/python bench/accept.py                        # SQLite, c64, 10 s, 3 runs
    .venv/bin/python bench/accept.py --connections 16 --duration 20
    .venv/bin/python bench/accept.py --database-url postgresql://postgres@127.0.0.1:5432/bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

FLOWHOOK = str(Path(sys.executable).with_name("flowhook"))
FLOW = {
    "name": "bench",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n + 1 }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
        {"id": "c", "type": "transform", "output": {"z": "{{ steps.b.output.y }}"}},
    ],
    "output": {"z": "{{ steps.c.output.z }}"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def run_wrk(
    url: str, key: str, flow_id: str, connections: int, duration: int, workdir: Path
) -> dict[str, float]:
    body = json.dumps({"flow_id": flow_id, "trigger": "api", "payload": {"n": 1}})
    lua = workdir / "execute.lua"
    lua.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(lua), url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    if bad or errors:
        print(out, file=sys.stderr)
    return {"rps": rps, "p50": p50, "p99": p99, "non2xx": float(bad.group(1)) if bad else 0.0}


def one_round(args: argparse.Namespace) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-bench-"))
    db_url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
    port = free_port()
    env = {
        **os.environ,
        "FLOWHOOK_DATABASE_URL": db_url,
        "FLOWHOOK_PORT": str(port),
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    created = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", "bench", "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    key = json.loads(created.stdout)["key"]
    server = subprocess.Popen([FLOWHOOK, "serve"], env=env, cwd=workdir, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        auth = {"Authorization": f"Bearer {key}"}
        flow_id = httpx.post(f"{base}/api/v1/flows", json=FLOW, headers=auth).json()["flow_id"]
        return run_wrk(
            f"{base}/api/v1/flows/execute", key, flow_id, args.connections, args.duration, workdir
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=int, default=10, help="seconds per round")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    backend = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"accept: POST /api/v1/flows/execute, {backend}, c{args.connections}, {args.duration}s x {args.repeat}"
    )
    rounds = []
    for i in range(args.repeat):
        r = one_round(args)
        rounds.append(r)
        print(
            f"  round {i + 1}: {r['rps']:8.0f} runs/s   p50 {r['p50']:6.1f} ms   p99 {r['p99']:6.1f} ms   non-202 {r['non2xx']:.0f}"
        )
    med = {k: statistics.median(r[k] for r in rounds) for k in ("rps", "p50", "p99")}
    print(
        f"  median : {med['rps']:8.0f} runs/s   p50 {med['p50']:6.1f} ms   p99 {med['p99']:6.1f} ms"
    )


if __name__ == "__main__":
    main()
