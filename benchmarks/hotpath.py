"""The window worker's hot path alone: CPU per request of one in-process worker draining a
full queue with the built-in ``echo`` model (no compute), optionally under cProfile.

    python -m benchmarks.hotpath                    # 20,000 requests, 3 drains
    python -m benchmarks.hotpath --requests 5000 --profile 25

Not a ``Scenario`` (no RESULTS.md section): a developer's probe of the code path the
``overhead`` scenario's drain pass measures end to end with real worker processes. A Redis
server (AOF off) is started for the run; each drain fills the queue first (``Client``), then
runs one ``Worker`` on this process's event loop until the queue is empty and stops it. The
figure is this process's CPU time (``time.process_time``: every thread, so the heartbeat and
the helper threads too) over the drain, divided by the requests; it is far less sensitive to
other tenants' load than requests/s, which is printed next to it (wall clock, from the first
claim to the last result, so disturbed on a loaded machine).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import tempfile
import time
import uuid

import redis

import inferq
from inferq.cli.worker import settle_garbage_collector
from inferq.connection import ConnectionSettings
from inferq.embedded import EmbeddedServer
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import WorkerConfig
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker as Worker

STOP_TIMEOUT_S = 30.0


def fill(url: str, model: str, n: int, chunk: int = 1000) -> None:
    with inferq.Client(url) as client:
        for start in range(0, n, chunk):
            client.enqueue_many([f"request {i} of the hot path probe, a short prompt"
                                 for i in range(start, min(n, start + chunk))], model=model)


async def drain(url: str, model: str, n: int, max_batch_size: int,
                profiler: cProfile.Profile | None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one worker draining the queue of ``n`` requests."""
    keys = QueueKeys.for_model("embed", model)
    config = WorkerConfig(connection=ConnectionSettings(url), model_name=model,
                          model_spec="builtin:echo", max_batch_size=max_batch_size, max_wait_ms=2.0,
                          max_batch_tokens=None, worker_id=f"hotpath-{uuid.uuid4().hex[:6]}")
    worker = Worker(config, EchoModel())

    async def watch() -> None:
        seen, since = -1, time.monotonic()
        while worker.stats.completed < n and time.monotonic() - since < STOP_TIMEOUT_S:
            if worker.stats.completed != seen:
                seen, since = worker.stats.completed, time.monotonic()
            await asyncio.sleep(0.005)
        if worker.stats.completed >= n:
            worker.request_stop()
            await asyncio.sleep(STOP_TIMEOUT_S)
        print(f"stuck for {STOP_TIMEOUT_S:.0f} s: {worker.stats}; the tasks:", flush=True)
        for task in asyncio.all_tasks():
            task.print_stack()
        raise SystemExit(1)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    watcher = asyncio.create_task(watch())
    await worker.run(install_signal_handlers=False)
    watcher.cancel()
    if profiler is not None:
        profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert worker.stats.completed == n, (worker.stats.completed, n)
    with redis.Redis.from_url(url) as probe:
        assert probe.zcard(keys.pending) == 0 and probe.zcard(keys.inflight) == 0
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=512)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the last drain; print the top N functions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedServer(tmp, appendonly=False) as server:
        url = server.url
        fill(url, "warm", 2000)
        asyncio.run(drain(url, "warm", 2000, args.max_batch_size, None))
        settle_garbage_collector()  # as `inferq worker` does before it serves
        for trial in range(args.trials):
            model = f"hot{trial}"
            fill(url, model, args.requests)
            profiler = (cProfile.Profile() if args.profile and trial == args.trials - 1
                        else None)
            cpu, wall = asyncio.run(drain(url, model, args.requests, args.max_batch_size,
                                          profiler))
            print(f"trial {trial + 1}: {cpu / args.requests * 1e6:6.1f} us CPU per request "
                  f"(worker process), {args.requests / wall:8.0f} requests/s wall "
                  f"(incl. start and stop)", flush=True)
            if profiler is not None:
                out = io.StringIO()
                stats = pstats.Stats(profiler, stream=out)
                stats.sort_stats("tottime").print_stats(args.profile)
                stats.sort_stats("cumulative").print_stats(args.profile)
                print(out.getvalue())


if __name__ == "__main__":
    main()
