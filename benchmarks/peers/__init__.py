"""The ``overhead`` baselines: their adapters (``peer.Peer``, one module a library,
``catalog.PEERS``) and here their worker side, a no-op job each: rq's ``rq worker`` runs
``noop``, ``arq benchmarks.peers.ArqSettings``, ``python -m saq benchmarks.peers.saq_settings``,
and ``run_bullmq`` for BullMQ's Python port (which has no CLI), with a pooled ``redis.asyncio``
client; BullMQ on Node.js is ``bullmq-node/``. Their CLIs import this module by name, so it
imports a library only where that library's worker needs it; settings come from the
environment.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, ClassVar

URL_ENV = "INFERQ_BENCH_PEER_URL"
CONCURRENCY_ENV = "INFERQ_BENCH_PEER_CONCURRENCY"
POOL_ENV = "INFERQ_BENCH_PEER_POOL"
ARQ_MAX_JOBS_ENV = "INFERQ_BENCH_ARQ_MAX_JOBS"
ARQ_POLL_DELAY_ENV = "INFERQ_BENCH_ARQ_POLL_DELAY"
QUEUE = "bench"
#: Jobs in flight of BullMQ and SAQ (as for tuned arq).
CONCURRENCY = 100
#: arq's own defaults (``Worker(max_jobs=10, poll_delay=0.5)``).
ARQ_DEFAULT_MAX_JOBS = 10
ARQ_DEFAULT_POLL_DELAY = 0.5


def _url() -> str:
    return os.environ.get(URL_ENV, "redis://127.0.0.1:6379/1")


def _concurrency() -> int:
    return int(os.environ.get(CONCURRENCY_ENV, CONCURRENCY))


def noop(*args: Any, **kwargs: Any) -> None:
    """The job of rq (any arguments), arq and SAQ (a context first), BullMQ (job, token)."""


async def anoop(*args: Any, **kwargs: Any) -> None:
    """``noop`` as a coroutine, for the asyncio libraries."""


def _arq_redis_settings() -> Any:
    try:
        from arq.connections import RedisSettings
    except ImportError:  # rq, SAQ and BullMQ import this module too, where arq may be absent
        return None
    return RedisSettings.from_dsn(_url())


class ArqSettings:
    """``arq benchmarks.peers.ArqSettings``: the standard arq worker, no-op job."""

    functions: ClassVar[list[Any]] = [anoop]
    redis_settings = _arq_redis_settings()
    max_jobs = int(os.environ.get(ARQ_MAX_JOBS_ENV, ARQ_DEFAULT_MAX_JOBS))
    poll_delay = float(os.environ.get(ARQ_POLL_DELAY_ENV, ARQ_DEFAULT_POLL_DELAY))
    # Results are kept (arq's default, one hour): the benchmark reads their finish times.
    health_check_interval = 3600


def saq_settings() -> dict[str, Any]:
    """``python -m saq benchmarks.peers.saq_settings``."""
    from saq import Queue

    return {"queue": Queue.from_url(_url(), name=QUEUE), "functions": [("noop", anoop)],
            "concurrency": _concurrency()}


async def run_bullmq() -> None:
    import redis.asyncio as aioredis
    from bullmq import Worker

    # A pool: one connection per job in flight, and one for the worker's blocking BZPOPMIN.
    pooled = os.environ.get(POOL_ENV, "1") == "1"
    connection: Any = (aioredis.Redis.from_url(_url(), decode_responses=True,
                                               max_connections=_concurrency() + 8)
                       if pooled else _url())
    worker = Worker(QUEUE, anoop, {"connection": connection, "concurrency": _concurrency()})
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.close()
