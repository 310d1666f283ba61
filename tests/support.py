"""Helpers for tests that start real server processes."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx

__all__ = [
    "FLOWHOOK",
    "TEST_SECRET_KEY",
    "Server",
    "free_port",
    "serve",
    "worker",
    "secret_key_env",
    "wait_for",
]

T = TypeVar("T")

FLOWHOOK = str(Path(sys.executable).with_name("flowhook"))

TEST_SECRET_KEY = "dGVzdC1zZWNyZXQta2V5LW9mLTMyLWJ5dGVzLi4uLi4="
"""FLOWHOOK_SECRET_KEY for the tests on PostgreSQL (SQLite ones use a key file)."""


def wait_for(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.05) -> T:
    """``check()``'s first truthy answer, asked every ``interval`` seconds; an
    ``AssertionError`` when none comes within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def secret_key_for(database_url: str) -> str | None:
    return TEST_SECRET_KEY if database_url.startswith("postgres") else None


def secret_key_env(database_url: str) -> dict[str, str]:
    key = secret_key_for(database_url)
    return {"FLOWHOOK_SECRET_KEY": key} if key else {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int, output: list[str]) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.output = output

    def value(self, label: str) -> str:
        for line in self.output:
            if line.strip().startswith(label):
                return line.split(":", 1)[1].split()[0]
        raise AssertionError(f"{label!r} not printed:\n" + "".join(self.output))


@contextmanager
def serve(
    cwd: Path,
    database_url: str,
    command: str = "serve",
    args: tuple[str, ...] = (),
    **env_extra: str,
) -> Iterator[Server]:
    port = free_port()
    env = {
        **os.environ,
        **secret_key_env(database_url),
        "FLOWHOOK_DATABASE_URL": database_url,
        "FLOWHOOK_PORT": str(port),
        **env_extra,
    }
    proc = subprocess.Popen(
        [FLOWHOOK, command, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or []], daemon=True)
    reader.start()
    output: list[str] = []
    deadline = time.monotonic() + 30

    def drain() -> None:
        while True:
            try:
                output.append(lines.get_nowait())
            except queue.Empty:
                return

    try:
        while True:
            drain()
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("server did not start:\n" + "".join(output))
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        time.sleep(0.1)
        drain()
        yield Server(proc, port, output)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        if proc.stdout:
            proc.stdout.close()


@contextmanager
def worker(cwd: Path, database_url: str, **env_extra: str) -> Iterator[subprocess.Popen[str]]:
    """A `flowhook worker` process (no HTTP); stopped with SIGTERM at the end if still alive."""
    env = {
        **os.environ,
        **secret_key_env(database_url),
        "FLOWHOOK_DATABASE_URL": database_url,
        **env_extra,
    }
    proc = subprocess.Popen(
        [FLOWHOOK, "worker"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()
