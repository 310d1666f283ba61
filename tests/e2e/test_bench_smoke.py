"""The benchmark suite still runs: every benchmark once, small, on both backends (a smoke
run; the figures are not judged here, only that each was measured and the report written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import IN_CI, PG_URL

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]
FIGURES = [
    "accept_c16_rps", "accept_c64_rps", "accept_c64_p99", "api_only_rps", "empty_c64_rps",
    "ratio_c64", "ratio_api_only",
    "e2e_rps", "e2e_p50", "e2e_p99", "deliveries_rps", "idle_p50", "idle_p99",
]  # fmt: skip


def test_the_benchmark_suite_runs_on_both_backends(tmp_path: Path) -> None:
    backends = ["sqlite"]
    if PG_URL:
        backends.append("postgresql")
    elif IN_CI:
        pytest.fail("FLOWHOOK_TEST_DATABASE_URL is not set; CI must run the PostgreSQL tests")
    command = [sys.executable, str(ROOT / "bench" / "suite.py"), "--smoke"]
    command += ["--backends", ",".join(backends), "--out", str(tmp_path)]
    if PG_URL:
        command += ["--postgres-url", PG_URL]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "latest.json").read_text())
    for backend in backends:
        measured = report["medians"][backend]
        for figure in FIGURES:
            assert measured[figure] > 0, (backend, figure, measured)
    assert (tmp_path / "latest.png").stat().st_size > 10_000
    assert "accept c64, runs/s" in done.stdout  # the table was printed


def test_one_broadcast_resumes_exactly_its_batch_of_waiting_runs() -> None:
    """bench/signals.py, small: 300 runs wait, one signal resumes its 100 and no other (the
    bench exits 1 otherwise), on both backends."""
    backends = "sqlite,postgresql" if PG_URL else "sqlite"
    command = [sys.executable, str(ROOT / "bench" / "signals.py"), "--runs", "300"]
    command += ["--backends", backends]
    if PG_URL:
        command += ["--postgres-url", PG_URL]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    for backend in backends.split(","):
        assert f"{backend}: 300 runs waiting" in done.stdout, done.stdout
    assert done.stdout.count("matching 100, all 100 completed") == len(backends.split(","))
    assert done.stdout.count("200 still waiting") == len(backends.split(","))


def test_the_overview_bench_runs_on_both_backends() -> None:
    """bench/overview.py, small: it writes its runs, the page sees the day's runs (the bench
    fails otherwise), and every read is timed on each backend."""
    backends = ["sqlite", "postgresql"] if PG_URL else ["sqlite"]
    command = [sys.executable, str(ROOT / "bench" / "overview.py"), "--runs", "5000"]
    command += ["--deliveries", "3000", "--repeat", "1", "--backends", ",".join(backends)]
    if PG_URL:
        command += ["--postgres-url", PG_URL]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    # a line per backend, then the table's row
    assert done.stdout.count("whole page (two connections at once)") == len(backends) + 1
    assert "| queue depth and ages |" in done.stdout


def test_the_progress_transaction_bench_runs_on_both_backends() -> None:
    """bench/progress_tx.py, small: each run is claimed and its progress applied (the bench
    fails otherwise), and both are timed on each backend."""
    backends = ["sqlite", "postgresql"] if PG_URL else ["sqlite"]
    command = [sys.executable, str(ROOT / "bench" / "progress_tx.py"), "--runs", "50"]
    command += ["--backends", ",".join(backends)]
    if PG_URL:
        command += ["--postgres-url", PG_URL]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    for backend in backends:
        assert f"{backend}: claim p50 " in done.stdout, done.stdout
    assert done.stdout.count("progress transaction p50 ") == len(backends)


def test_ab_alternates_two_checkouts_and_cleans_up(tmp_path: Path) -> None:
    """bench/ab.sh, small: the base commit checked out beside this checkout, each measured
    once per pair, the first of a pair flipped every pair, and nothing left behind (its
    worktree and results live under TMPDIR)."""
    command = ["bash", str(ROOT / "bench" / "ab.sh"), "HEAD", "2", "sqlite", "idle", "--smoke"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    pairs = [line for line in done.stdout.splitlines() if line.startswith("== pair")]
    assert pairs == [
        "== pair 1: base HEAD",
        "== pair 1: change",
        "== pair 2: change",
        "== pair 2: base HEAD",
    ], done.stdout
    assert done.stdout.count("idle execute → webhook p50 ms") == 4, done.stdout
    assert list(tmp_path.iterdir()) == []
    listed = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, cwd=ROOT)
    assert str(tmp_path) not in listed.stdout
