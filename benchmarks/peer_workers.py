"""The worker side of the ``bullmq`` and ``saq`` baselines of ``overhead``: a no-op job each,
set up as an expert user of each library would (see the ``overhead`` docstring and RESULTS.md
for why).

* SAQ: its own CLI, ``python -m saq benchmarks.peer_workers.saq_settings``; the settings are
  a callable (SAQ calls it) that reads the URL and the concurrency from the environment.
* BullMQ (the official Python port) has no CLI: ``python -m benchmarks.peer_workers bullmq``
  runs ``bullmq.Worker`` until SIGTERM. It passes the worker a pooled ``redis.asyncio`` client:
  given a URL, BullMQ opens a *single-connection* client, on which ``concurrency`` jobs
  serialise their round trips (it then tops out near 1,000 jobs/s whatever the concurrency).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

URL_ENV = "INFERQ_BENCH_PEER_URL"
QUEUE_ENV = "INFERQ_BENCH_PEER_QUEUE"
CONCURRENCY_ENV = "INFERQ_BENCH_PEER_CONCURRENCY"
POOL_ENV = "INFERQ_BENCH_PEER_POOL"
#: What the benchmark runs them with: 100 jobs in flight, as for tuned arq.
CONCURRENCY = 100


def _url() -> str:
    return os.environ.get(URL_ENV, "redis://127.0.0.1:6379/3")


def _concurrency() -> int:
    return int(os.environ.get(CONCURRENCY_ENV, CONCURRENCY))


async def saq_noop(ctx: dict[str, Any], **kwargs: Any) -> None:
    """The SAQ job: does nothing (SAQ passes its context first, the job's kwargs after)."""
    return None


def saq_settings() -> dict[str, Any]:
    """``python -m saq benchmarks.peer_workers.saq_settings``."""
    from saq import Queue

    return {"queue": Queue.from_url(_url(), name=os.environ.get(QUEUE_ENV, "bench")),
            "functions": [saq_noop], "concurrency": _concurrency()}


async def bullmq_noop(job: Any, token: str) -> None:
    """The BullMQ job: does nothing."""
    return None


async def run_bullmq() -> None:
    import redis.asyncio as aioredis
    from bullmq import Worker

    # A pool (not BullMQ's default single connection): one connection per job in flight, and
    # one for the worker's blocking BZPOPMIN.
    pooled = os.environ.get(POOL_ENV, "1") == "1"
    connection: Any = (aioredis.Redis.from_url(_url(), decode_responses=True,
                                               max_connections=_concurrency() + 8)
                       if pooled else _url())
    worker = Worker(os.environ.get(QUEUE_ENV, "bench"), bullmq_noop,
                    {"connection": connection, "concurrency": _concurrency()})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"bullmq worker ready (concurrency {_concurrency()}, pooled {pooled})", flush=True)
    await stop.wait()
    await worker.close()


def main(argv: list[str]) -> int:
    if argv != ["bullmq"]:
        print("usage: python -m benchmarks.peer_workers bullmq", file=sys.stderr)
        return 2
    asyncio.run(run_bullmq())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
