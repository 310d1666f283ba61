"""Workers in the team's own code, as users run them: `flowhook tasks serve MODULE:WORKER`
processes (the SDK's Worker) against a real server, on both backends. A worker killed with
-9 mid-task loses it at its lease's end and another finishes it as attempt 2 (attempt 1
listed as interrupted); SIGTERM drains (the task held is finished, then exit 0); three
workers and 2,000 tasks: each completed once as recorded, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import FLOWHOOK, serve, wait_for

pytestmark = pytest.mark.e2e

WORKER_MODULE = '''
"""The team's own code: a worker with three tasks (written by the test)."""
import os, pathlib, time
from flowhook import Worker

MARKS = pathlib.Path(os.environ["MARKS"])
worker = Worker(os.environ["FLOWHOOK_URL"], os.environ["FLOWHOOK_API_KEY"],
                concurrency=int(os.environ.get("CONCURRENCY", "8")),
                worker_id=os.environ.get("WORKER_ID"), claim_wait=2)


@worker.task("hold")
def hold(value, ctx):
    """Marks that it started, then holds the task until the test lets it go."""
    (MARKS / f"started-{ctx.task_id}-{ctx.attempt}").touch()
    while not (MARKS / "release").exists():
        time.sleep(0.02)
    return {"held": value, "attempt": ctx.attempt}


@worker.task("count")
async def count(value, ctx):
    with open(MARKS / f"done-{os.getpid()}", "a") as f:
        f.write(f"{ctx.task_id} {ctx.attempt}\\n")
    return value * 2
'''


@contextmanager
def task_worker(
    folder: Path, base: str, key: str, name: str, **env: str
) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [FLOWHOOK, "tasks", "serve", "workmod:worker"],
        cwd=folder,
        env={**os.environ, "FLOWHOOK_URL": base, "FLOWHOOK_API_KEY": key, "MARKS": str(folder),
             "WORKER_ID": name, "PYTHONPATH": str(folder), **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "workmod.py").write_text(textwrap.dedent(WORKER_MODULE))
    return tmp_path


def start(client: httpx.Client, definition: dict[str, Any], payloads: list[Any]) -> list[str]:
    r = client.post("/api/v1/flows", json=definition)
    assert r.status_code == 201, r.text
    flow_id = r.json()["flow_id"]
    ids = []
    for payload in payloads:
        r = client.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": payload})
        assert r.status_code == 202, r.text
        ids.append(r.json()["run_id"])
    return ids


def ended(client: httpx.Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    def look() -> dict[str, Any] | None:
        run = client.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 5}).json()
        return run if run["status"] in ("completed", "failed", "cancelled") else None

    return wait_for(look, timeout=timeout)


HOLD = {"name": "hold", "steps": [
    {"id": "h", "type": "task", "task": "hold", "input": "{{ payload.v }}",
     "heartbeat_seconds": 1},
]}  # fmt: skip


def test_a_worker_killed_mid_task_loses_it_to_another_as_attempt_2(
    folder: Path, database_url: str
) -> None:
    with serve(folder, database_url, FLOWHOOK_LOG_LEVEL="warning") as server:
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:  # fmt: skip
            [run_id] = start(client, HOLD, [{"v": 7}])
            with task_worker(folder, server.base, key, "first") as first:
                started = wait_for(lambda: list(folder.glob("started-*-1")), timeout=30)
                first.kill()  # kill -9, holding the task
                first.wait(timeout=10)
            task_id = started[0].name.split("-")[1]
            (folder / "release").touch()
            with task_worker(folder, server.base, key, "second") as second:
                run = ended(client, run_id)
                second.send_signal(signal.SIGTERM)
                said = second.stdout.read() if second.stdout else ""
        assert (folder / f"started-{task_id}-2").exists(), (
            f"{run} {sorted(p.name for p in folder.iterdir())} {said}"
        )
    assert run["status"] == "completed", run
    [step] = run["steps"]
    assert step["output"] == {"held": 7, "attempt": 2}
    assert step["attempts"] == 2 and step["interrupted_attempts"] == [1], step


def test_sigterm_finishes_the_task_held_then_exits_0(folder: Path, database_url: str) -> None:
    with serve(folder, database_url, FLOWHOOK_LOG_LEVEL="warning") as server:
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:  # fmt: skip
            [run_id] = start(client, HOLD, [{"v": 1}])
            with task_worker(folder, server.base, key, "draining") as proc:
                wait_for(lambda: list(folder.glob("started-*-1")), timeout=30)
                proc.send_signal(signal.SIGTERM)  # it claims no more, finishes what it holds
                (folder / "release").touch()
                assert proc.wait(timeout=30) == 0
                output = proc.stdout.read() if proc.stdout else ""
            run = ended(client, run_id)
    assert run["status"] == "completed" and run["steps"][0]["attempts"] == 1, run
    assert "stopped after 1 tasks" in output, output


@pytest.mark.soak  # a load: ~45 s a backend on a loaded machine
def test_three_workers_and_2000_tasks_each_completed_once(folder: Path, database_url: str) -> None:
    flow = {"name": "count", "steps": [
        {"id": "c", "type": "task", "task": "count", "input": "{{ payload.n }}"},
    ]}  # fmt: skip
    with serve(folder, database_url, FLOWHOOK_LOG_LEVEL="warning",
               FLOWHOOK_RATE_LIMIT="0") as server:  # fmt: skip
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:  # fmt: skip
            ids = start(client, flow, [{"n": n} for n in range(2000)])
            with (
                task_worker(folder, server.base, key, "a", CONCURRENCY="16"),
                task_worker(folder, server.base, key, "b", CONCURRENCY="16"),
                task_worker(folder, server.base, key, "c", CONCURRENCY="16"),
            ):
                runs = [ended(client, run_id, timeout=120) for run_id in ids]
    assert all(r["status"] == "completed" for r in runs)
    assert sorted(r["steps"][0]["output"] for r in runs) == [2 * n for n in range(2000)]
    done = [line.split() for p in folder.glob("done-*") for line in p.read_text().splitlines()]
    task_ids = {t for t, _ in done}
    assert len(task_ids) == 2000  # none lost
    assert all(r["steps"][0]["attempts"] == 1 for r in runs)  # each completed once, as recorded


def test_the_shell_worker_of_docs_workers_md_runs_a_task(tmp_path: Path, database_url: str) -> None:
    """The protocol is what docs/workers.md says: its worker in shell (curl and jq) runs."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "workers.md").read_text()
    block = doc.split("<!-- worker.sh -->", 1)[1].split("<!-- /worker.sh -->", 1)[0]
    script = tmp_path / "worker.sh"
    script.write_text(block.split("```sh\n", 1)[1].rsplit("```", 1)[0])
    greet = {"name": "greet", "steps": [
        {"id": "hello", "type": "task", "task": "greet", "input": {"name": "{{ payload.who }}"}},
    ]}  # fmt: skip
    with serve(tmp_path, database_url, FLOWHOOK_LOG_LEVEL="warning") as server:
        key = server.value("sandbox key")
        with httpx.Client(base_url=server.base, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:  # fmt: skip
            [run_id] = start(client, greet, [{"who": "Ada"}])
            shell = subprocess.Popen(
                ["sh", str(script)], start_new_session=True,
                env={**os.environ, "FLOWHOOK_URL": server.base, "FLOWHOOK_API_KEY": key},
            )  # fmt: skip
            try:
                run = ended(client, run_id)
            finally:
                os.killpg(shell.pid, signal.SIGKILL)  # the loop and the curl it may be in
                shell.wait(timeout=10)
    assert run["status"] == "completed", run
    assert run["steps"][0]["output"] == {"greeting": "Hello, Ada"}
