"""Every remote CLI command, run as a process against a real server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import FLOWHOOK, Server, serve

pytestmark = pytest.mark.e2e


def cli(server: Server, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "FLOWHOOK_URL": server.base,
        "FLOWHOOK_API_KEY": key or server.value("sandbox key"),
        "COLUMNS": "200",
    }
    return subprocess.run([FLOWHOOK, *args], env=env, capture_output=True, text=True, timeout=60)


def ok(server: Server, *args: str) -> str:
    done = cli(server, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def js(server: Server, *args: str) -> Any:
    return json.loads(ok(server, *args, "--json"))


def test_every_remote_command(tmp_path: Path) -> None:
    env = {
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_WEBHOOK_RETRY_SCHEDULE": "0.1",
        "FLOWHOOK_LOG_LEVEL": "warning",
        "FLOWHOOK_MIN_SCHEDULE_SECONDS": "1",  # the schedule below ticks every second
    }
    with serve(tmp_path, f"sqlite:///{tmp_path / 'cli.db'}", **env) as server:
        flow_file = tmp_path / "flow.yaml"
        flow_file.write_text(
            "name: Greeter\nsteps:\n  - id: hello\n    type: transform\n    output:\n      text: 'hi {{ payload.name }}'\n"
            "output:\n  text: '{{ steps.hello.output.text }}'\n"
        )
        created = js(server, "flows", "apply", "-f", str(flow_file))
        assert created["version"] == 1
        again = js(server, "flows", "apply", "-f", str(flow_file))
        assert (again["flow_id"], again["version"]) == (created["flow_id"], 2)
        assert "Greeter" in ok(server, "flows", "list")
        flow_id = created["flow_id"]

        out = ok(server, "runs", "start", flow_id, "--payload", '{"name": "Ada"}', "--wait")
        assert "hello" in out and "completed" in out
        run = js(server, "runs", "start", flow_id, "--payload", '{"name": "Bob"}', "--wait")
        assert run["output"] == {"text": "hi Bob"}
        failing = tmp_path / "fail.json"
        failing.write_text(
            json.dumps({"name": "Fails", "steps": [{"id": "x", "type": "fail", "message": "nope"}]})
        )
        fail_id = js(server, "flows", "apply", "-f", str(failing))["flow_id"]
        failed = cli(server, "runs", "start", fail_id, "--wait")
        assert failed.returncode == 1 and "failed" in failed.stdout and "nope" in failed.stdout
        bad = cli(server, "runs", "start", flow_id, "--payload", "[1]")
        assert bad.returncode == 2 and "JSON object" in bad.stderr

        runs = js(server, "runs", "list", "--flow", flow_id)
        assert len(runs) == 2
        assert "completed" in ok(server, "runs", "list")
        assert "hello" in ok(server, "runs", "show", runs[0]["run_id"])
        assert js(server, "runs", "show", runs[0]["run_id"])["status"] == "completed"
        first = runs[0]["run_id"]
        waiter = tmp_path / "wait.json"
        waiter.write_text(
            json.dumps(
                {
                    "name": "Waits",
                    "steps": [
                        {"id": "paid", "type": "wait", "signal": "order.paid",
                         "match": {"order_id": "{{ payload.order_id }}"}}
                    ],
                }
            )
        )  # fmt: skip
        wait_id = js(server, "flows", "apply", "-f", str(waiter))["flow_id"]
        waiting = js(server, "runs", "start", wait_id, "--payload", '{"order_id": "o1"}')
        deadline = time.monotonic() + 10
        while "for signal order.paid" not in ok(server, "runs", "show", waiting["run_id"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert '(order_id="o1")' in ok(server, "runs", "show", waiting["run_id"])
        sent = js(server, "signals", "send", "order.paid", "--data", '{"order_id": "o1"}')
        assert sent["matched"] == 1 and sent["id"].startswith("sig_")
        out = ok(server, "signals", "send", "order.paid", "--data", '{"order_id": "o2"}')
        assert "resumed 0 waiting" in out
        refused = cli(server, "signals", "send", "order.paid", "--data", "[1]")
        assert refused.returncode == 2 and "JSON object" in refused.stderr
        asks = tmp_path / "asks.json"
        asks.write_text(
            json.dumps(
                {
                    "name": "Asks",
                    "steps": [
                        {"id": "paid", "type": "wait", "signal": "order.paid",
                         "timeout_seconds": 3, "on_timeout": "continue"},
                        {"id": "ok", "type": "approval", "message": "Ship order {{ payload.n }}?",
                         "timeout_seconds": 3, "on_timeout": "approve"},
                    ],
                }
            )
        )  # fmt: skip
        asks_id = js(server, "flows", "apply", "-f", str(asks))["flow_id"]
        out = ok(server, "runs", "start", asks_id, "--payload", '{"n": 7}', "--wait")
        # --wait polls every 2 s: each 3 s wait is seen waiting, with what for and until when
        assert "for signal order.paid until 20" in out, out
        assert "for approval: Ship order 7? until 20" in out, out
        assert "completed" in out
        again = js(server, "runs", "rerun", first, "--payload", '{"name": "Cy"}', "--wait")
        assert (again["rerun_of"], again["output"]) == (first, {"text": "hi Cy"})
        out = ok(server, "runs", "rerun", first, "--version", "latest")
        assert f"(rerun of {first})" in out
        queued_rerun = js(server, "runs", "rerun", first, "--version", "1")
        assert queued_rerun["rerun_of"] == first and queued_rerun["status"] == "queued"
        refused = cli(server, "runs", "rerun", first, "--from-step", "nope")
        assert refused.returncode == 1 and "'nope'" in refused.stderr
        refused = cli(server, "runs", "rerun", first, "--version", "two")
        assert refused.returncode == 2 and "--version" in refused.stderr
        slow = tmp_path / "slow.json"
        slow.write_text(
            json.dumps({"name": "Slow", "steps": [{"id": "w", "type": "delay", "seconds": 60}]})
        )
        slow_id = js(server, "flows", "apply", "-f", str(slow))["flow_id"]
        queued = js(server, "runs", "start", slow_id)
        time.sleep(0.3)
        assert js(server, "runs", "cancel", queued["run_id"])["status"] == "cancelled"

        endpoint = js(
            server,
            "endpoints",
            "add",
            "http://127.0.0.1:9/closed",
            "--events",
            "flow.completed,flow.failed",
        )
        assert endpoint["secret"].startswith("whsec_")
        assert "127.0.0.1:9" in ok(server, "endpoints", "list")
        paced = js(
            server, "endpoints", "add", "http://127.0.0.1:9/ledger", "--events",
            "flow.completed", "--rate-limit", "5", "--fifo", "--flow", flow_id,
        )  # fmt: skip
        assert (paced["rate_limit"], paced["ordering"]) == (5, "fifo")
        assert paced["filter"] == {"flow_ids": [flow_id]}
        ok(server, "runs", "start", flow_id, "--payload", '{"name": "Eve"}', "--wait")
        for _ in range(100):
            failed_deliveries = js(server, "deliveries", "list", "--failed")
            if failed_deliveries:
                break
            time.sleep(0.1)
        assert failed_deliveries and failed_deliveries[0]["status"] == "failed"
        assert "connection" in ok(server, "deliveries", "list", "--failed")
        replay = js(server, "deliveries", "replay", failed_deliveries[0]["id"])
        assert replay["replay_of"] == failed_deliveries[0]["id"]

        hook = js(server, "hooks", "create", flow_id, "--verify", "hmac")
        assert hook["url"].endswith(hook["id"]) and hook["verify"]["secret"]
        assert "POST" in ok(server, "hooks", "create", flow_id)
        out = ok(server, "hooks", "create", "--signal", "order.paid")
        assert "(sends signal order.paid)" in out and "POST http" in out
        neither = cli(server, "hooks", "create")
        assert neither.returncode == 2 and "--signal" in neither.stderr

        schedule = js(
            server,
            "schedules",
            "create",
            flow_id,
            "--cron",
            "* * * * * *",
            "--payload",
            '{"name": "cron"}',
        )
        assert schedule["next_run_at"]
        assert schedule["id"] in ok(server, "schedules", "list")
        for _ in range(50):  # the server's scheduler starts a run within a couple of seconds
            if any(
                r["trigger"] == "schedule" for r in js(server, "runs", "list", "--flow", flow_id)
            ):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("no scheduled run")

        nokey = subprocess.run(
            [FLOWHOOK, "runs", "list"],
            env={k: v for k, v in os.environ.items() if k != "FLOWHOOK_API_KEY"},
            capture_output=True,
            text=True,
        )
        assert nokey.returncode == 2 and "FLOWHOOK_API_KEY" in nokey.stderr
        wrong = cli(server, "runs", "list", key="sk_test_" + "a" * 32)
        assert wrong.returncode == 1 and "401" in wrong.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("runs", "list"),
        ("flows", "list"),
        ("endpoints", "list"),
        ("runs", "start", "wf_x", "--wait"),
    ],
)
def test_a_server_that_cannot_be_reached_is_one_line_not_a_traceback(
    args: tuple[str, ...],
) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done = subprocess.run(
            [FLOWHOOK, *args],
            env={**os.environ, "FLOWHOOK_URL": url, "FLOWHOOK_API_KEY": "sk_test_x"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr == (
        f"error: cannot reach Flowhook at {url}: is `flowhook serve` running? "
        "Set FLOWHOOK_URL otherwise.\n"
    ), done.stderr


def test_flows_by_name_show_and_decisions_from_the_cli(tmp_path: Path) -> None:
    with serve(
        tmp_path, f"sqlite:///{tmp_path / 'cli.db'}", FLOWHOOK_LOG_LEVEL="warning"
    ) as server:
        asks = tmp_path / "asks.json"
        asks.write_text(
            json.dumps(
                {"name": "Ship order",
                 "steps": [{"id": "ok", "type": "approval", "message": "Ship {{ payload.n }}?"},
                           {"id": "done", "type": "transform", "output": {"shipped": True}}]}
            )
        )  # fmt: skip
        flow_id = js(server, "flows", "apply", "-f", str(asks))["flow_id"]
        shown = ok(server, "flows", "show", "Ship order")
        assert flow_id in shown and "version 1" in shown and "ok approval" in shown
        assert js(server, "flows", "show", flow_id)["name"] == "Ship order"
        missing = cli(server, "runs", "start", "No such flow")
        assert missing.returncode == 2 and "no flow is named 'No such flow'" in missing.stderr

        def waiting(n: int) -> str:
            run_id = str(
                js(server, "runs", "start", "ship ORDER", "--payload", f'{{"n": {n}}}')["run_id"]
            )
            deadline = time.monotonic() + 20
            while "for approval: Ship" not in ok(server, "runs", "show", run_id):
                assert time.monotonic() < deadline, "the run never asked"
                time.sleep(0.1)
            return run_id

        approved, rejected = waiting(1), waiting(2)
        out = ok(server, "runs", "approve", approved, "ok", "--comment", "fine")
        assert f"{approved} step ok approved" in out
        again = cli(server, "runs", "approve", approved, "ok")
        assert again.returncode == 1 and "already" in (again.stderr + again.stdout).lower()
        assert js(server, "runs", "reject", rejected, "ok", "--comment", "no")["approved"] is False
        for run_id, status in ((approved, "completed"), (rejected, "failed")):
            deadline = time.monotonic() + 20
            while (run := js(server, "runs", "show", run_id))["status"] != status:
                assert time.monotonic() < deadline, run
                time.sleep(0.1)


def test_the_commands_a_user_reaches_for_manage_flows_hooks_schedules_and_endpoints(
    tmp_path: Path,
) -> None:
    """flows versions|delete, hooks list|show|rotate|delete, schedules pause|resume|delete,
    endpoints show|test|delete: each against a real server, names beside ids in the lists,
    and each deleted thing gone afterwards (the next command about it answers 404)."""
    env = {"FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true", "FLOWHOOK_LOG_LEVEL": "warning"}
    with serve(tmp_path, f"sqlite:///{tmp_path / 'cli.db'}", **env) as server:
        flow_file = tmp_path / "flow.json"
        flow_file.write_text(json.dumps({"name": "Nightly report", "steps": [
            {"id": "a", "type": "transform", "output": {"ok": True}}]}))  # fmt: skip
        flow_id = js(server, "flows", "apply", "-f", str(flow_file))["flow_id"]
        js(server, "flows", "apply", "-f", str(flow_file))  # version 2
        versions = js(server, "flows", "versions", "Nightly report")
        assert [v["version"] for v in versions] == [2, 1]
        table = ok(server, "flows", "versions", flow_id)
        assert "version" in table and "created" in table

        hook = js(server, "hooks", "create", flow_id, "--verify", "hmac")
        listed = ok(server, "hooks", "list")
        assert hook["id"] in listed and "Nightly report" in listed and "hmac" in listed
        shown = ok(server, "hooks", "show", hook["id"])
        assert f"starts runs of {flow_id} (Nightly report)" in shown
        assert hook["verify"]["secret"] not in shown  # shown only when made or rotated
        rotated = js(server, "hooks", "rotate", hook["id"])
        assert (
            rotated["url"] != hook["url"]
            and rotated["verify"]["secret"] != hook["verify"]["secret"]
        )
        gone = cli(server, "hooks", "show", hook["id"])  # the old id and URL are gone
        assert gone.returncode == 1 and "error 404" in gone.stderr
        assert f"{rotated['id']} deleted" in ok(server, "hooks", "delete", rotated["id"])
        gone = cli(server, "hooks", "show", rotated["id"])
        assert gone.returncode == 1 and "error 404" in gone.stderr
        assert "no hooks" in ok(server, "hooks", "list")

        schedule = js(server, "schedules", "create", flow_id, "--cron", "0 3 * * *")
        assert "Nightly report" in ok(server, "schedules", "list")
        assert "paused: no run until resumed" in ok(server, "schedules", "pause", schedule["id"])
        assert js(server, "schedules", "list")[0]["enabled"] is False
        assert "paused" in ok(server, "schedules", "list")
        assert "resumed: next run" in ok(server, "schedules", "resume", schedule["id"])
        assert js(server, "schedules", "list")[0]["enabled"] is True
        assert f"{schedule['id']} deleted" in ok(server, "schedules", "delete", schedule["id"])
        assert "no schedules" in ok(server, "schedules", "list")

        with socket.socket() as sink:  # an address that answers nothing useful: the test
            sink.bind(("127.0.0.1", 0))  # event is queued and delivered (or retried) later
            url = f"http://127.0.0.1:{sink.getsockname()[1]}/hook"
            ep = js(
                server,
                "endpoints",
                "add",
                url,
                "--events",
                "flow.completed",
                "--description",
                "orders",
            )
            shown = ok(server, "endpoints", "show", ep["id"])
            assert url in shown and "events: flow.completed" in shown and "orders" in shown
            assert ep["secret"] not in shown
            event = js(server, "endpoints", "test", ep["id"])
            assert event["event"] == "webhook.test"
            assert "webhook.test queued for" in ok(server, "endpoints", "test", ep["id"])
            assert "paused: its deliveries wait" in ok(server, "endpoints", "pause", ep["id"])
            assert "paused since" in ok(server, "endpoints", "list")
            assert "state: paused since" in ok(server, "endpoints", "show", ep["id"])
            assert js(server, "endpoints", "show", ep["id"])["paused"] is True
            assert "resumed" in ok(server, "endpoints", "resume", ep["id"])
            assert js(server, "endpoints", "show", ep["id"])["paused"] is False
            assert f"{ep['id']} deleted" in ok(server, "endpoints", "delete", ep["id"])
            gone = cli(server, "endpoints", "show", ep["id"])
            assert gone.returncode == 1 and "error 404" in gone.stderr

        assert "deleted (archived" in ok(server, "flows", "delete", "Nightly report")
        gone = cli(server, "runs", "start", flow_id)
        assert gone.returncode == 1 and "error 404" in gone.stderr


def test_flows_kept_as_code_are_applied_all_or_nothing(tmp_path: Path) -> None:
    """`flowhook flows apply PATH…`: created, unchanged, new version N per file, found by slug;
    --dry-run changes nothing; one invalid file is named and nothing is applied."""
    repo = tmp_path / "flows"
    (repo / "billing").mkdir(parents=True)
    orders = repo / "orders.yaml"
    orders.write_text(
        "name: Orders\nslug: orders\nsteps:\n  - {id: a, type: transform, output: {v: 1}}\n"
    )
    refunds = repo / "billing" / "refunds.json"
    refunds.write_text(json.dumps({"name": "Refunds", "slug": "refunds",
                                   "steps": [{"id": "r", "type": "transform", "output": {}}]}))  # fmt: skip
    with serve(
        tmp_path, f"sqlite:///{tmp_path / 'apply.db'}", FLOWHOOK_LOG_LEVEL="warning"
    ) as server:
        first = ok(server, "flows", "apply", str(repo))
        assert "orders.yaml: created wf_" in first and "refunds.json: created wf_" in first, first
        again = js(server, "flows", "apply", str(repo))
        assert [a["result"] for a in again] == ["unchanged", "unchanged"], again
        assert all(a["version"] == 1 for a in again)

        orders.write_text(orders.read_text().replace("v: 1", "v: 2"))
        planned = ok(server, "flows", "apply", "--dry-run", str(repo))
        assert "orders.yaml: would be new version 2" in planned, planned
        assert versions(server) == {"orders": 1, "refunds": 1}

        broken = repo / "broken.json"
        broken.write_text(json.dumps({"name": "Broken", "slug": "broken",
                                      "steps": [{"id": "x", "type": "transfrom"}]}))  # fmt: skip
        refused = cli(server, "flows", "apply", str(repo))
        assert refused.returncode == 1, refused
        assert "broken.json" in refused.stderr and "steps[0].type" in refused.stderr
        assert "nothing was applied" in refused.stderr
        assert versions(server) == {"orders": 1, "refunds": 1}

        broken.unlink()
        applied = js(server, "flows", "apply", str(repo))
        assert {a["file"].rsplit("/", 1)[-1]: (a["result"], a["version"]) for a in applied} == {
            "orders.yaml": ("new version", 2), "refunds.json": ("unchanged", 1),
        }  # fmt: skip
        r = httpx.get(f"{server.base}/api/v1/flows", params={"slug": "orders"},
                      headers={"Authorization": f"Bearer {server.value('sandbox key')}"})  # fmt: skip
        [found] = r.json()["data"]
        assert found["version"] == 2 and found["definition"]["steps"][0]["output"] == {"v": 2}


def versions(server: Server) -> dict[str, int]:
    """Each flow's current version, by slug (the flows that have one)."""
    flows = json.loads(ok(server, "flows", "list", "--json"))
    return {f["definition"]["slug"]: f["version"] for f in flows if "slug" in f["definition"]}
