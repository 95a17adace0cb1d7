"""What the ``overhead`` scenario asks of a peer queue (``Peer``): its worker process, how
jobs go in and how their times come out; and what the peers' adapters share."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

import redis

#: How often a producer polls a peer for its jobs' progress.
POLL_S = 0.01
#: Single enqueues in flight at once (``gathered``: arq, SAQ).
ENQUEUE_CONCURRENCY = 50


class JobCounts(Protocol):
    """The jobs of a peer's pass (``OverheadConfig``)."""

    @property
    def peer_jobs(self) -> int: ...
    @property
    def arq_jobs(self) -> int: ...
    @property
    def rq_jobs(self) -> int: ...
    @property
    def rq_fork_jobs(self) -> int: ...


class Peer:
    """One baseline: its worker process, how jobs go in, how their times come out. ``add``
    enqueues; ``remaining`` is what the producer polls until the jobs are done, sending the
    commands ``poll`` (left out of the Redis counts); ``times`` gives each job's (start, end,
    ok) in seconds since the epoch, from the job records."""

    library = ""
    db = 1
    poll: Mapping[str, int] = {"zcard": 1}

    def __init__(self, name: str, label: str) -> None:
        self.name, self.label = name, label
        self.producer_cpu_s: float | None = None  # a producer outside this process

    def missing(self) -> str | None:
        found = importlib.util.find_spec(self.library) is not None
        return None if found else f"{self.library} is not installed"

    def jobs(self, cfg: JobCounts) -> int:
        return cfg.peer_jobs

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def ready(self, client: redis.Redis) -> bool:
        return True  # no sign of readiness: the warm-up waits for the first jobs

    async def open(self, db_url: str) -> None:
        self.db_url = db_url

    async def close(self) -> None:
        pass

    async def add(self, n: int) -> list[Any]:
        raise NotImplementedError

    async def enqueue(self, n: int) -> tuple[list[Any], float, float]:
        """The handles, the time of the first enqueue and the seconds enqueueing took."""
        t0 = time.time()
        handles = await self.add(n)
        return handles, t0, time.time() - t0

    async def remaining(self, n: int) -> int:
        raise NotImplementedError

    async def times(self, handles: list[Any]) -> list[tuple[float, float, bool]]:
        raise NotImplementedError


async def gathered(n: int, one: Any) -> list[Any]:
    """``one(i)`` for every job, ``ENQUEUE_CONCURRENCY`` at a time (no bulk API)."""
    out: list[Any] = []
    for start in range(0, n, ENQUEUE_CONCURRENCY):
        out += await asyncio.gather(*(one(i) for i in range(
            start, min(n, start + ENQUEUE_CONCURRENCY))))
    return [h for h in out if h is not None]


def utc_seconds(value: dt.datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def peer_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}
