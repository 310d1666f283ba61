"""Helpers for tests that start real server processes."""

from __future__ import annotations

import os
import queue
import re
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
    def __init__(
        self,
        proc: subprocess.Popen[str],
        port: int,
        output: list[str],
        more: Callable[[], None] | None = None,
    ) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.output = output
        self._more = more
        """Takes in what the process printed since (its output is read by a thread)."""

    def printed(self, fragment: str, timeout: float = 30.0) -> str:
        """The first line printed holding ``fragment``, once it is."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.output:
                if fragment in line:
                    return line
            if self._more is None or time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{fragment!r} not printed:\n" + "".join(self.output))
            time.sleep(0.02)
            self._more()

    def value(self, label: str, timeout: float = 30.0) -> str:
        """The value printed after ``label``: waits for the line (the first start's keys
        are printed as the server starts answering, not before)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.output:
                if line.strip().startswith(label):
                    return line.split(":", 1)[1].split()[0]
            if self._more is None or time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{label!r} not printed:\n" + "".join(self.output))
            time.sleep(0.02)
            self._more()


LISTENING = re.compile(r"^listening on http://[^\s]+:(\d+)$")


def listening_port(output: list[str]) -> int | None:
    """The port `flowhook serve` printed it took (FLOWHOOK_PORT=0), once it has."""
    for line in output:
        if found := LISTENING.match(line.strip()):
            return int(found.group(1))
    return None


@contextmanager
def serve(
    cwd: Path,
    database_url: str,
    command: str = "serve",
    args: tuple[str, ...] = (),
    split: bool = False,
    **env_extra: str,
) -> Iterator[Server]:
    """A `flowhook serve` (or ``command``) process on a port the kernel chose: the server binds
    port 0 and prints the port, so two tests (or xdist workers) never race for one. Stopped
    with SIGTERM at the end.

    `serve` runs with ``--single-process`` (one interpreter to start, not two) unless
    ``split``: a test about the API and engine processes, or one that kills the server as
    users run it, asks for the pair."""
    if command == "serve" and not split and "--single-process" not in args:
        args = (*args, "--single-process")
    chosen = env_extra.get("FLOWHOOK_PORT")
    env = {
        **os.environ,
        **secret_key_env(database_url),
        "FLOWHOOK_DATABASE_URL": database_url,
        "FLOWHOOK_PORT": "0",
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
    deadline = time.monotonic() + 60
    port = int(chosen) if chosen else None

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
            port = port or listening_port(output)
            if port is None:
                time.sleep(0.05)
                continue
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        drain()
        yield Server(proc, port, output, drain)
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
