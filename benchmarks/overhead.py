"""Scenario ``overhead``: what the queue itself costs, with the built-in ``echo`` model (no
compute), side by side with BullMQ's Python port, SAQ, ``arq`` and ``rq`` on the same Redis
server.

    python -m benchmarks overhead            # 50,000 requests per pass x 3 trials (~12 min)
    python -m benchmarks overhead --quick    # smoke test (~1 min)

inferq variants: 1, 2 and 4 ``python -m inferq worker --model echo-wN=builtin:echo`` processes
(``--max-batch-size 512 --max-wait-ms 2 --max-batch-tokens 0``), each set on its own queue,
all started once. Two passes per variant and trial:

* **end to end**: this process enqueues N requests with ``AsyncClient.enqueue_many`` in chunks
  and awaits every result (``AsyncHandle.result``: results arrive through the client's inbox,
  over one connection). Throughput = N / (first enqueue -> last result received).
* **drain** (queue + workers only): the workers are paused (SIGSTOP) while the same N requests
  are enqueued, then resumed; throughput = N / (first claim -> last result written), on the
  Redis clock. The producer does nothing meanwhile, so this is what the worker processes and
  Redis sustain on their own.

Every pass records the CPU seconds of each process (producer, workers, server) and the Redis
commands it caused (``INFO commandstats`` deltas, inner script commands included), per request.

Baselines, one worker process each, in the same Redis server (their own database numbers):
BullMQ's Python port (``Queue.addBulk``; ``bullmq.Worker`` at concurrency 100 with a pooled
``redis.asyncio`` client, ``benchmarks/peer_workers.py``) and SAQ (``python -m saq`` at
concurrency 100; one ``enqueue`` per job, 50 in a ``gather``: it has no bulk enqueue), timed
from the first enqueue to the last job's own finish time;
arq's standard worker (``arq benchmarks.baselines.ArqSettings``) with its defaults
(``max_jobs=10, poll_delay=0.5``) and tuned for throughput (``max_jobs=100,
poll_delay=0.01``), and rq's standard ``rq worker`` (a forked work horse per job) and its
``SimpleWorker`` (no fork). One no-op job per request, enqueued in bulk where the API allows
(rq ``Queue.enqueue_many``; arq ``enqueue_job`` 50 at a time in a ``gather``), timed from the
first enqueue to the last job's own finish time (their result records; this favours them
slightly: no result delivery to a waiting producer is counted). Baseline workers are started
for their pass only, so their polling never disturbs the other passes.

Targets: inferq with one worker >= 10x the best baseline's per-worker throughput, and >= 20,000
requests/s end to end with one worker process. Per-worker throughput is judged twice: end to
end (inferq also delivers every result to a waiting producer there, the baselines do not) and
draining a full queue (only the worker and Redis in the loop, the same work for everyone).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from benchmarks import baselines, charts, peer_workers
from benchmarks.framework import ByMode, Run, Scenario, int_list, noise_of, positive_int
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    fmt_range,
    markdown_table,
    say,
    stop_child,
    summary,
    verdict,
    version,
)
from benchmarks.stack import (
    SCRIPT_CALLS,
    SCRIPT_INNER_COMMANDS,
    WorkerProc,
    add_worker_arguments,
    batches_of,
    check_ok,
    enqueue_and_await,
    fill_and_drain,
    load_str,
    merge_counters,
    pcts,
    queue_probe,
    redis_delta,
    redis_snapshot,
    scaled,
    spawn_workers,
    sum_cpu,
    summarize_trials,
    window_flags,
)

if TYPE_CHECKING:
    from inferq.protocol.codec import Result

TARGET_RATIO = 10.0
TARGET_ONE_WORKER = 20_000.0
ARQ_TUNED = {"max_jobs": 100, "poll_delay": 0.01}
ARQ_ENQUEUE_CONCURRENCY = 50
POLL_S = 0.01
BASELINES = {
    "arq-default": ("arq", f"arq, defaults (max_jobs {baselines.ARQ_DEFAULT_MAX_JOBS}, "
                           f"poll_delay {baselines.ARQ_DEFAULT_POLL_DELAY} s)"),
    "arq-tuned": ("arq", f"arq, tuned (max_jobs {ARQ_TUNED['max_jobs']}, "
                         f"poll_delay {ARQ_TUNED['poll_delay']} s)"),
    "rq": ("rq", "rq, standard `rq worker` (forks a work horse per job)"),
    "rq-simple": ("rq", "rq, `rq worker -w rq.worker.SimpleWorker` (no fork)"),
    "bullmq": ("bullmq", f"BullMQ (Python port), concurrency {peer_workers.CONCURRENCY}, "
                         "pooled redis-py connection"),
    "bullmq-url": ("bullmq", f"BullMQ (Python port), concurrency {peer_workers.CONCURRENCY}, "
                             "given a URL (its default single connection)"),
    "saq": ("saq", f"SAQ, concurrency {peer_workers.CONCURRENCY}"),
}
ARQ_DB, RQ_DB, BULLMQ_DB, SAQ_DB = 1, 2, 3, 4
PEER_ENQUEUE_CONCURRENCY = 50
BULLMQ_BULK = 1000


@dataclass(frozen=True)
class OverheadConfig:
    requests: int
    worker_counts: tuple[int, ...]
    chunk: int
    waiters: int
    aof: bool
    max_batch_size: int
    max_wait_ms: float
    warmup: int
    arq_jobs: int
    rq_jobs: int
    rq_fork_jobs: int
    peer_jobs: int
    baselines: tuple[str, ...]
    timeout_s: float = 300.0

    @property
    def arq_tuned(self) -> dict[str, float]:
        return ARQ_TUNED


def _baselines(text: str) -> tuple[str, ...]:
    chosen = tuple(b.strip() for b in text.split(",") if b.strip())
    unknown = set(chosen) - set(BASELINES) - {"none"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; known: "
                                         f"{', '.join(BASELINES)}")
    return () if chosen == ("none",) else chosen


# ------------------------------------------------------------------------------- inferq


@dataclass
class Fleet:
    count: int
    model: str
    workers: list[WorkerProc]

    @property
    def name(self) -> str:
        return f"inferq-{self.count}"

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]


def start_fleets(cleanup: Cleanup, url: str, cfg: OverheadConfig, log_dir: Path
                 ) -> dict[str, Fleet]:
    fleets: dict[str, Fleet] = {}
    for count in cfg.worker_counts:
        model = f"echo-w{count}"
        workers = spawn_workers(cleanup, url, [f"bench-overhead-w{count}-{i}"
                                               for i in range(count)],
                                model_arg=f"{model}=builtin:echo", log_dir=log_dir,
                                flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
        fleet = Fleet(count, model, workers)
        fleets[fleet.name] = fleet
    return fleets


def _prompts(tag: str, n: int) -> list[str]:
    # ~24 bytes each: the size of a short id or sentence reference, not of a document.
    return [f"{tag}-{i:08d}-noop-request" for i in range(n)]


def _latency(results: Sequence[Result]) -> dict[str, Any]:
    total = [r.total_ms for r in results if r.total_ms is not None]
    wait = [r.queue_wait_ms for r in results if r.queue_wait_ms is not None]
    return {"total_ms": pcts(total), "queue_wait_ms": pcts(wait)}


def inferq_e2e_pass(url: str, fleet: Fleet, cfg: OverheadConfig, tag: str,
                    server: int | None) -> dict[str, Any]:
    prompts = _prompts(tag, cfg.requests)
    client = redis.Redis.from_url(url)
    probe = queue_probe(server, fleet.pids)
    before = redis_snapshot(client)
    probe.start()
    results, seconds, enqueue_s = asyncio.run(enqueue_and_await(
        url, fleet.model, prompts, cfg.chunk, fleet.workers, cfg.timeout_s, cfg.waiters))
    cpu = probe.stop()
    after = redis_snapshot(client)
    client.close()
    check_ok(results, len(prompts), f"{fleet.name} end to end", outputs=prompts)
    n = len(results)
    redis_work = redis_delta(before, after, n)
    sizes = batches_of(results)
    out: dict[str, Any] = {
        "throughput": n / seconds, "seconds": seconds, "enqueue_seconds": enqueue_s,
        "enqueue_rate": n / enqueue_s, **_latency(results),
        "batch_sizes": dict(sorted(sizes.items())),
        "mean_batch_size": n / max(sum(sizes.values()), 1),
        "cpu_seconds": cpu, "other_load": cpu["other_load"],
        "cpu_us_per_request": _cpu_us(cpu, n), "redis": asdict(redis_work),
    }
    say(f"  {fleet.name:<11} end to end {out['throughput']:8.0f} req/s in {seconds:.2f} s "
        f"(enqueue {n / enqueue_s:.0f}/s); mean batch {out['mean_batch_size']:.0f}; "
        f"CPU us/req producer {out['cpu_us_per_request']['producer']:.0f}, workers "
        f"{out['cpu_us_per_request']['workers']:.0f}, Redis "
        f"{out['cpu_us_per_request']['server']:.0f}; {redis_work.commands_per_request:.1f} "
        f"Redis commands/req; other load {load_str(cpu['other_load'])}")
    return out


def _cpu_us(cpu: Mapping[str, float | None], n: int) -> dict[str, float | None]:
    def per(value: float | None) -> float | None:
        return None if value is None else value / max(n, 1) * 1e6
    return {"producer": per(cpu.get("producer")), "workers": per(sum_cpu(cpu, "worker")),
            "server": per(cpu.get("server"))}


def inferq_drain_pass(cleanup: Cleanup, url: str, fleet: Fleet, cfg: OverheadConfig, tag: str,
                      server: int | None) -> dict[str, Any]:
    prompts = _prompts(tag, cfg.requests)
    d = fill_and_drain(cleanup, url, fleet.model, prompts, chunk=cfg.chunk,
                       paused_workers=fleet.workers, active=fleet.workers, server=server,
                       timeout_s=cfg.timeout_s)
    check_ok(d.results, len(prompts), f"{fleet.name} drain", outputs=prompts)
    n = len(d.results)
    sizes = batches_of(d.results)
    out: dict[str, Any] = {
        "throughput": d.throughput, "wall_throughput": n / d.wall_s, "seconds": d.seconds,
        "batch_sizes": dict(sorted(sizes.items())),
        "mean_batch_size": n / max(sum(sizes.values()), 1),
        "cpu_seconds": d.cpu, "other_load": d.cpu["other_load"],
        "cpu_us_per_request": _cpu_us(d.cpu, n), "redis": asdict(d.redis_drain),
        "redis_fill": asdict(d.redis_fill),
    }
    say(f"  {fleet.name:<11} drain      {out['throughput']:8.0f} req/s (Redis clock; wall "
        f"{out['wall_throughput']:.0f}); mean batch {out['mean_batch_size']:.0f}; CPU us/req "
        f"workers {out['cpu_us_per_request']['workers']:.0f}, Redis "
        f"{out['cpu_us_per_request']['server']:.0f}; other load "
        f"{load_str(d.cpu['other_load'])}")
    return out


def warm_up(url: str, fleets: Mapping[str, Fleet], cfg: OverheadConfig) -> None:
    """Every fleet answers a burst (scripts cached, pools open, the window fitted)."""
    for fleet in fleets.values():
        prompts = _prompts("warm", cfg.warmup)
        results, _, _ = asyncio.run(enqueue_and_await(url, fleet.model, prompts, cfg.chunk,
                                                       fleet.workers, cfg.timeout_s))
        check_ok(results, len(prompts), f"{fleet.name} warm-up", outputs=prompts)


# ---------------------------------------------------------------------------- baselines


def available(library: str) -> bool:
    return importlib.util.find_spec(library) is not None


def _db_url(url: str, db: int) -> str:
    return url.rsplit("/", 1)[0] + f"/{db}"


def _ts(value: dt.datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def _wait_for(what: str, check: Any, child_alive: Any, log_tail: Any,
              timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if not child_alive():
            raise BenchmarkFailed(f"{what}: the worker exited:\n{log_tail()}")
        if time.monotonic() > deadline:
            raise BenchmarkFailed(f"{what}: not done within {timeout_s:.0f} s\n{log_tail()}")
        time.sleep(POLL_S)


def arq_pass(cleanup: Cleanup, url: str, variant: str, jobs: int, log_dir: Path,
             server: int | None, timeout_s: float) -> dict[str, Any]:
    from arq.connections import ArqRedis, RedisSettings, create_pool
    from arq.constants import default_queue_name, health_check_key_suffix
    from arq.jobs import Job

    db_url = _db_url(url, ARQ_DB)
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    tuned = variant == "arq-tuned"
    env = {**os.environ, baselines.ARQ_URL_ENV: db_url, "PYTHONUNBUFFERED": "1"}
    if tuned:
        env[baselines.ARQ_MAX_JOBS_ENV] = str(ARQ_TUNED["max_jobs"])
        env[baselines.ARQ_POLL_DELAY_ENV] = str(ARQ_TUNED["poll_delay"])
    child = cleanup.spawn(variant, [sys.executable, "-m", "arq",
                                    "benchmarks.baselines.ArqSettings"],
                          log_path=log_dir / f"{variant}.log", env=env)
    try:
        _wait_for(f"{variant} start",
                  lambda: client.exists(default_queue_name + health_check_key_suffix),
                  child.alive, child.log_tail, 60)

        async def go(n: int, measure: bool) -> tuple[list[Any], float, dict[str, Any]]:
            pool: ArqRedis = await create_pool(RedisSettings.from_dsn(db_url))
            try:
                probe = queue_probe(server, [child.process.pid])
                before = redis_snapshot(client)
                probe.start()
                t0 = time.time()
                handles: list[Job] = []
                for start in range(0, n, ARQ_ENQUEUE_CONCURRENCY):
                    batch = await asyncio.gather(*(
                        pool.enqueue_job("arq_noop", i)
                        for i in range(start, min(n, start + ARQ_ENQUEUE_CONCURRENCY))))
                    handles += [j for j in batch if j is not None]
                polls = 0
                deadline = time.monotonic() + timeout_s
                while await pool.zcard(default_queue_name):
                    polls += 1
                    if not child.alive() or time.monotonic() > deadline:
                        raise BenchmarkFailed(f"{variant}: jobs not done\n{child.log_tail()}")
                    await asyncio.sleep(POLL_S)
                infos = [await j.result_info() for j in handles]
                while any(i is None for i in infos):
                    await asyncio.sleep(POLL_S)
                    infos = [await j.result_info() for j in handles]
                cpu = probe.stop()
                after = redis_snapshot(client)
                extra = {"cpu": cpu, "redis": redis_delta(before, after, n,
                                                          own={"zcard": polls + 1})}
                return infos, t0, extra if measure else {}
            finally:
                await pool.aclose()

        asyncio.run(go(20, measure=False))  # warm-up
        infos, t0, extra = asyncio.run(go(jobs, measure=True))
    finally:
        stop_child(child)
        client.flushdb()
        client.close()
    failed = sum(1 for i in infos if not i.success)
    end = max(i.finish_time.timestamp() for i in infos)
    first_start = min(i.start_time.timestamp() for i in infos)
    return _baseline_result(variant, jobs, t0, first_start, end, failed, extra)


def rq_pass(cleanup: Cleanup, url: str, variant: str, jobs: int, log_dir: Path,
            server: int | None, timeout_s: float) -> dict[str, Any]:
    from rq import Queue
    from rq.job import Job

    db_url = _db_url(url, RQ_DB)
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    queue_name = f"bench-{variant}"
    argv = [sys.executable, "-m", "rq.cli", "worker", "--url", db_url, "--quiet",
            "--name", f"bench-{variant}", queue_name]
    if variant == "rq-simple":
        argv += ["--worker-class", "rq.worker.SimpleWorker"]
    child = cleanup.spawn(variant, argv, log_path=log_dir / f"{variant}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    queue = Queue(queue_name, connection=client)
    try:
        _wait_for(f"{variant} start", lambda: client.scard("rq:workers") > 0, child.alive,
                  child.log_tail, 60)

        def go(n: int, measure: bool) -> tuple[list[Job], float, dict[str, Any]]:
            probe = queue_probe(server, [child.process.pid])
            finished = queue.finished_job_registry
            failed = queue.failed_job_registry
            done_before = (finished.get_job_count(cleanup=False)
                           + failed.get_job_count(cleanup=False))
            before = redis_snapshot(client)
            probe.start()
            t0 = time.time()
            enqueued = queue.enqueue_many(
                [Queue.prepare_data(baselines.noop, (i,), result_ttl=3600) for i in range(n)])
            polls = [0]

            def all_done() -> bool:
                polls[0] += 1
                done = (finished.get_job_count(cleanup=False)
                        + failed.get_job_count(cleanup=False))
                return bool(done - done_before >= n)

            _wait_for(variant, all_done, child.alive, child.log_tail, timeout_s)
            cpu = probe.stop()
            after = redis_snapshot(client)
            fetched = [j for j in Job.fetch_many([j.id for j in enqueued], connection=client)
                       if j is not None]
            extra = {"cpu": cpu, "redis": redis_delta(before, after, n,
                                                      own={"zcard": 2 * polls[0]})}
            return fetched, t0, extra if measure else {}

        go(10, measure=False)  # warm-up
        fetched, t0, extra = go(jobs, measure=True)
    finally:
        stop_child(child)
        client.flushdb()
        client.close()
    ended = [j.ended_at for j in fetched if j.ended_at is not None]
    started = [j.started_at for j in fetched if j.started_at is not None]
    failed_jobs = sum(1 for j in fetched if j.get_status(refresh=False) != "finished")
    if len(ended) < jobs:
        raise BenchmarkFailed(f"{variant}: only {len(ended)} of {jobs} jobs have an end time")
    return _baseline_result(variant, jobs, t0, min(_ts(s) for s in started),
                            max(_ts(e) for e in ended), failed_jobs, extra)


def _peer_env(db_url: str, pooled: bool = True) -> dict[str, str]:
    return {**os.environ, peer_workers.URL_ENV: db_url, peer_workers.QUEUE_ENV: "bench",
            peer_workers.CONCURRENCY_ENV: str(peer_workers.CONCURRENCY),
            peer_workers.POOL_ENV: "1" if pooled else "0", "PYTHONUNBUFFERED": "1"}


def bullmq_pass(cleanup: Cleanup, url: str, jobs: int, log_dir: Path, server: int | None,
                timeout_s: float, *, pooled: bool) -> dict[str, Any]:
    """BullMQ's Python port: ``Queue.addBulk`` in chunks of ``BULLMQ_BULK`` (its bulk API),
    the worker (``benchmarks.peer_workers``) with a pooled connection and concurrency 100;
    timed from the first add to the last job's ``finishedOn``."""
    import redis.asyncio as aioredis
    from bullmq import Queue

    db_url = _db_url(url, BULLMQ_DB)
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    variant = "bullmq" if pooled else "bullmq-url"
    child = cleanup.spawn(variant, [sys.executable, "-m", "benchmarks.peer_workers", "bullmq"],
                          log_path=log_dir / f"{variant}.log", env=_peer_env(db_url, pooled))
    try:
        _wait_for("bullmq start", lambda: "ready" in child.log_tail(), child.alive,
                  child.log_tail, 60)

        async def go(n: int, measure: bool) -> tuple[list[Any], float, dict[str, Any]]:
            conn = aioredis.Redis.from_url(db_url, decode_responses=True)
            queue = Queue("bench", {"connection": conn})
            try:
                done_before = await queue.getJobCountByTypes("completed", "failed")
                probe = queue_probe(server, [child.process.pid])
                before = redis_snapshot(client)
                probe.start()
                t0 = time.time()
                added: list[Any] = []
                for start in range(0, n, BULLMQ_BULK):
                    added += await queue.addBulk([
                        {"name": "noop", "data": {"i": i}}
                        for i in range(start, min(n, start + BULLMQ_BULK))])
                polls = 0
                deadline = time.monotonic() + timeout_s
                while await queue.getJobCountByTypes("completed", "failed") - done_before < n:
                    polls += 1
                    if not child.alive() or time.monotonic() > deadline:
                        raise BenchmarkFailed(f"bullmq: jobs not done\n{child.log_tail()}")
                    await asyncio.sleep(POLL_S)
                cpu = probe.stop()
                after = redis_snapshot(client)
                jobs_done = await queue.getJobs(["completed", "failed"])
                mine = {str(j.id) for j in added}
                times = [(j.processedOn, j.finishedOn, j.failedReason)
                         for j in jobs_done if str(j.id) in mine]
                extra = {"cpu": cpu, "redis": redis_delta(before, after, n,
                                                          own={"evalsha": polls + 1})}
                return times, t0, extra if measure else {}
            finally:
                await queue.close()

        asyncio.run(go(20, measure=False))  # warm-up
        times, t0, extra = asyncio.run(go(jobs, measure=True))
    finally:
        stop_child(child)
        client.flushdb()
        client.close()
    if len(times) < jobs:
        raise BenchmarkFailed(f"{variant}: only {len(times)} of {jobs} jobs have finish times")
    failed = sum(1 for _, _, reason in times if reason)
    return _baseline_result(variant, jobs, t0, min(p for p, _, _ in times) / 1e3,
                            max(f for _, f, _ in times) / 1e3, failed, extra)


def saq_pass(cleanup: Cleanup, url: str, jobs: int, log_dir: Path, server: int | None,
             timeout_s: float) -> dict[str, Any]:
    """SAQ: ``Queue.enqueue`` one job at a time (SAQ has no bulk enqueue), 50 in a
    ``gather`` as for arq; its standard worker (``python -m saq``) at concurrency 100; timed
    from the first enqueue to the last job's ``completed``."""
    from saq import Queue

    db_url = _db_url(url, SAQ_DB)
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    child = cleanup.spawn("saq", [sys.executable, "-m", "saq",
                                  "benchmarks.peer_workers.saq_settings"],
                          log_path=log_dir / "saq.log", env=_peer_env(db_url))
    try:
        # No readiness signal to wait for: the warm-up below waits for SAQ's first jobs.
        async def go(n: int, measure: bool) -> tuple[list[Any], float, dict[str, Any]]:
            queue = Queue.from_url(db_url, name="bench")
            await queue.connect()
            try:
                probe = queue_probe(server, [child.process.pid])
                before = redis_snapshot(client)
                probe.start()
                t0 = time.time()
                enqueued: list[Any] = []
                for start in range(0, n, PEER_ENQUEUE_CONCURRENCY):
                    batch = await asyncio.gather(*(
                        queue.enqueue("saq_noop", i=i)
                        for i in range(start, min(n, start + PEER_ENQUEUE_CONCURRENCY))))
                    enqueued += [j for j in batch if j is not None]
                polls = 0
                deadline = time.monotonic() + timeout_s
                while await queue.count("incomplete"):
                    polls += 1
                    if not child.alive() or time.monotonic() > deadline:
                        raise BenchmarkFailed(f"saq: jobs not done\n{child.log_tail()}")
                    await asyncio.sleep(POLL_S)
                cpu = probe.stop()
                after = redis_snapshot(client)
                done = await queue.jobs([j.key for j in enqueued])
                times = [(j.started, j.completed, j.status.value) for j in done
                         if j is not None]
                extra = {"cpu": cpu, "redis": redis_delta(before, after, n,
                                                          own={"zcard": polls + 1})}
                return times, t0, extra if measure else {}
            finally:
                await queue.disconnect()

        asyncio.run(go(20, measure=False))  # warm-up
        times, t0, extra = asyncio.run(go(jobs, measure=True))
    finally:
        stop_child(child)
        client.flushdb()
        client.close()
    if len(times) < jobs:
        raise BenchmarkFailed(f"saq: only {len(times)} of {jobs} jobs have finish times")
    failed = sum(1 for _, _, status in times if status != "complete")
    return _baseline_result("saq", jobs, t0, min(s for s, _, _ in times) / 1e3,
                            max(c for _, c, _ in times) / 1e3, failed, extra)


def _baseline_result(variant: str, jobs: int, t0: float, first_start: float, end: float,
                     failed: int, extra: Mapping[str, Any]) -> dict[str, Any]:
    cpu = extra["cpu"]
    redis_work = extra["redis"]
    out: dict[str, Any] = {
        "throughput": jobs / max(end - t0, 1e-6), "seconds": end - t0,
        "drain_throughput": jobs / max(end - first_start, 1e-6), "failed": failed,
        "jobs": jobs, "cpu_seconds": cpu, "other_load": cpu["other_load"],
        "cpu_us_per_request": _cpu_us(cpu, jobs), "redis": asdict(redis_work),
    }
    say(f"  {variant:<11} {out['throughput']:8.0f} jobs/s ({jobs} jobs in {end - t0:.2f} s; "
        f"first start -> last finish {out['drain_throughput']:.0f}/s); CPU us/job worker "
        f"{out['cpu_us_per_request']['workers']:.0f}, Redis "
        f"{out['cpu_us_per_request']['server']:.0f}; {redis_work.commands_per_request:.1f} "
        f"Redis commands/job; other load {load_str(cpu['other_load'])}")
    if failed:
        raise BenchmarkFailed(f"{variant}: {failed} jobs failed")
    return out


# ------------------------------------------------------------------------------ reports


def figures(fleets: Mapping[str, Fleet], trials: Mapping[str, Sequence[Mapping[str, Any]]],
            skipped: Mapping[str, str], exit_codes: Mapping[str, int | None]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    summaries: dict[str, Any] = {}
    loads: list[float | None] = []
    for name, fleet in fleets.items():
        ts = trials[name]
        loads += [t[m]["other_load"] for t in ts for m in ("e2e", "drain")]
        summaries[name] = {
            "workers": fleet.count,
            "e2e": _summarize_pass([t["e2e"] for t in ts]),
            "drain": _summarize_pass([t["drain"] for t in ts]),
            "batch_sizes_e2e": merge_counters(t["e2e"]["batch_sizes"] for t in ts),
            "trials": list(ts),
        }
    for name in trials:
        if name in fleets:
            continue
        ts = trials[name]
        loads += [t["other_load"] for t in ts]
        summaries[name] = {
            "label": BASELINES[name][1], "workers": 1,
            "e2e": _summarize_pass(ts),
            "drain_throughput": summarize_trials(ts, ["drain_throughput"]),
            "trials": list(ts),
        }
    report["variants"] = summaries
    report["skipped"] = dict(skipped)
    report["worker_exit_codes"] = dict(exit_codes)
    report["noise"] = noise_of(loads)

    one = summaries.get("inferq-1")
    base_names = [n for n in trials if n not in fleets]
    ratios: dict[str, Any] = {}
    if one is not None and base_names:
        for b in base_names:
            paired = [i["e2e"]["throughput"] / t["throughput"]
                      for i, t in zip(trials["inferq-1"], trials[b], strict=True)]
            ratios[b] = summary(paired)
        best = max(base_names, key=lambda b: summaries[b]["e2e"]["throughput"]["median"] or 0.0)
        ratios["best_baseline"] = best
        median = ratios[best]["median"]
        ratios["verdict"] = verdict(median, TARGET_RATIO)
    report["ratios"] = ratios
    if one is not None:
        median = one["e2e"]["throughput"]["median"]
        report["one_worker_target"] = {
            "target": TARGET_ONE_WORKER, "e2e_median": median,
            "drain_median": one["drain"]["throughput"]["median"],
            "verdict": verdict(median, TARGET_ONE_WORKER)}
    return report


def drain_ratios(report: Mapping[str, Any]) -> dict[str, Any]:
    """inferq's one-worker drain throughput over each baseline's, trial by trial, and the
    verdict against the best baseline."""
    v = report["variants"]
    one = v.get("inferq-1")
    names = [n for n in v if not n.startswith("inferq")]
    if one is None or not names:
        return {}
    mine = one["drain"]["throughput"]["trials"]
    out: dict[str, Any] = {
        n: summary([a / b for a, b in zip(mine, v[n]["drain_throughput"]["trials"],
                                          strict=True) if b])
        for n in names}
    best = max(names, key=lambda n: v[n]["drain_throughput"]["median"] or 0.0)
    median = out[best]["median"]
    out["best_baseline"] = best
    out["verdict"] = verdict(median, TARGET_RATIO)
    return out


def _summarize_pass(ts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "throughput": summarize_trials(ts, ["throughput"]),
        "other_load": summarize_trials(ts, ["other_load"]),
    }
    for part in ("producer", "workers", "server"):
        out[f"cpu_us_{part}"] = summarize_trials(ts, ["cpu_us_per_request", part])
    for key in ("commands_per_request", "client_commands_per_request",
                "script_calls_per_request", "ops_per_s", "cpu_share"):
        out[f"redis_{key}"] = summarize_trials(ts, ["redis", key])
    for key in ("enqueue_rate", "mean_batch_size", "wall_throughput"):
        if any(key in t for t in ts):
            out[key] = summarize_trials(ts, [key])
    for q in ("p50", "p99"):
        if any("total_ms" in t for t in ts):
            out[f"total_ms_{q}"] = summarize_trials(ts, ["total_ms", q])
    commands: dict[str, list[float]] = {}
    for t in ts:
        for cmd, v in t["redis"]["by_command_per_request"].items():
            commands.setdefault(cmd, []).append(v)
    out["redis_by_command"] = {cmd: sorted(vs)[len(vs) // 2] for cmd, vs in commands.items()}
    return out


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    v = r["variants"]
    names = list(v)
    groups = [f"inferq\n{v[n]['workers']} worker{'s' if v[n]['workers'] > 1 else ''}"
              if n.startswith("inferq") else n.replace("-", "\n") for n in names]

    def col(name: str, key: str, stat: str) -> float | None:
        s = v[name]["e2e"]["throughput"] if key == "e2e" else (
            v[name]["drain"]["throughput"] if "drain" in v[name]
            else v[name]["drain_throughput"])
        value = s.get(stat)
        return None if value is None else float(value)

    labels = {"e2e": "end to end", "drain": "drain (queue + workers only, no producer)"}
    bars = {labels[k]: [col(n, k, "median") for n in names] for k in labels}
    low = {labels[k]: [col(n, k, "min") for n in names] for k in labels}
    high = {labels[k]: [col(n, k, "max") for n in names] for k in labels}
    path = charts.grouped_bars(
        folder / "overhead-throughput.png",
        title="No-op requests per second (log scale); arq and rq: one worker process",
        ylabel="requests/s", groups=groups, bars=bars, low=low, high=high,
        hlines=[("target: 20,000 req/s end to end, one inferq worker", TARGET_ONE_WORKER)],
        logy=True, note="median over trials, bars = min..max; one Redis server for all")
    return [path]


def _f(s: Mapping[str, Any], digits: int = 0) -> str:
    return fmt_range(s, digits)


def results_markdown(r: Mapping[str, Any]) -> str:
    v = r["variants"]
    c = r["config"]
    rows = []
    for name, s in v.items():
        e2e = s["e2e"]
        if name.startswith("inferq"):
            label = f"**inferq**, {s['workers']} worker process{'es' if s['workers'] > 1 else ''}"
            drain = _f(s["drain"]["throughput"])
            per_worker = _f(scaled(e2e["throughput"], 1 / s["workers"]))
        else:
            label = s["label"]
            drain = _f(s["drain_throughput"])
            per_worker = _f(e2e["throughput"])
        cpu = " / ".join(_f(e2e[f"cpu_us_{p}"]) for p in ("producer", "workers", "server"))
        rows.append([label, _f(e2e["throughput"]), per_worker, drain, cpu,
                     f"{_f(e2e['redis_commands_per_request'], 1)} "
                     f"({_f(e2e['redis_client_commands_per_request'], 2)})",
                     _f(scaled(e2e["other_load"], 100))])
    table = markdown_table(
        ["variant", "end to end req/s", "per worker process", "drain req/s (no producer)",
         "CPU us/request: producer / workers / Redis", "Redis commands/request (sent by "
         "clients)", "other tenants' load %"], rows)

    one = v.get("inferq-1")
    cmd_table = ""
    if one is not None:
        e2e_cmds = one["e2e"]["redis_by_command"]
        drain_cmds = one["drain"]["redis_by_command"]
        names = sorted(set(e2e_cmds) | set(drain_cmds),
                       key=lambda k: -(e2e_cmds.get(k, 0.0)))
        cmd_rows = []
        for name in names:
            where = ("script call (one round trip)" if name in SCRIPT_CALLS else
                     "inside a script" if name in SCRIPT_INNER_COMMANDS else "sent by a client")
            cmd_rows.append([f"`{name.upper()}`", where, f"{e2e_cmds.get(name, 0.0):.4f}",
                             f"{drain_cmds.get(name, 0.0):.4f}"])
        cmd_rows.append(["**all commands**", "", _f(one["e2e"]["redis_commands_per_request"], 2),
                         _f(one["drain"]["redis_commands_per_request"], 2)])
        cmd_rows.append(["**sent by clients**", "",
                         _f(one["e2e"]["redis_client_commands_per_request"], 3),
                         _f(one["drain"]["redis_client_commands_per_request"], 3)])
        cmd_table = markdown_table(["command", "where", "per request, end to end",
                                    "per request, drain"], cmd_rows)

    ratio_rows = []
    ratios = r["ratios"]
    for name, s in ratios.items():
        if isinstance(s, dict):
            ratio_rows.append([f"inferq (1 worker) / {v[name]['label']}, end to end",
                               _f(s, 1),
                               f">= {TARGET_RATIO:.0f}" if name == ratios.get("best_baseline")
                               else "", ratios["verdict"] if name == ratios.get("best_baseline")
                               else ""])
    drained = drain_ratios(r)
    if drained:
        best = drained["best_baseline"]
        ratio_rows.append([f"inferq (1 worker) / {v[best]['label']}, draining a full queue "
                           "(worker-bound, no producer)", _f(drained[best], 1),
                           f">= {TARGET_RATIO:.0f}", drained["verdict"]])
    target = r.get("one_worker_target", {})
    if target:
        ratio_rows.append(["inferq, one worker, end to end req/s",
                           _f(v["inferq-1"]["e2e"]["throughput"]),
                           f">= {TARGET_ONE_WORKER:,.0f}", target["verdict"]])
        ratio_rows.append(["inferq, one worker, drain req/s (no producer in the loop)",
                           _f(v["inferq-1"]["drain"]["throughput"]), "(context)", ""])
    ratio_table = markdown_table(["measure", "median (min..max)", "target", "verdict"],
                                 ratio_rows)
    skipped = "".join(f"\n- Skipped {b}: {why}." for b, why in r["skipped"].items())
    reading = cpu_reading(r)
    waiting = ("one task per handle awaiting `result()`" if not c["waiters"] else
               f"{c['waiters']} coroutines awaiting `result()` in enqueue order")
    aof = "with AOF (`appendfsync everysec`)" if c["aof"] else "**without AOF** (`--no-aof`)"
    return f"""- Workload: inferq {c['requests']} no-op requests per pass (the built-in `echo` model; workers `--max-batch-size {c['max_batch_size']} --max-wait-ms {c['max_wait_ms']:g} --max-batch-tokens 0`), `AsyncClient.enqueue_many` in chunks of {c['chunk']}, {waiting}; baselines: one no-op job per request ({c['arq_jobs']} arq jobs, a quarter of that for arq's defaults; {c['rq_jobs']} rq SimpleWorker jobs, {c['rq_fork_jobs']} for the forking rq worker; {c['peer_jobs']} BullMQ and SAQ jobs); {c['trials']} trial(s), variants rotated per trial; median (min..max) over trials. One Redis server {aof} for everything.{skipped}

{PEERS_SETUP}

{table}

"End to end": first enqueue -> last result received by the producer (inferq), or -> the last job's own finish time (arq, rq: no delivery to a waiting producer counted). "Drain": the queue is filled while the workers are paused, then they are resumed; first claim -> last result (inferq, Redis clock) or first start -> last finish (arq, rq). CPU is user + system seconds per request of each process (the producer is this benchmark process); "Redis commands/request" counts every command Redis executed, script internals included, and in parentheses those sent by clients (script calls and plain commands).

{ratio_table}

{reading}

Redis commands per request, inferq with one worker (medians over trials):

{cmd_table}
"""  # noqa: E501


PEERS_SETUP = f"""How each peer is set up, as an expert user of it would (from its documentation and source):

- **BullMQ** (the official Python port): jobs added with `Queue.addBulk`, {BULLMQ_BULK} per call (its bulk API, one script call per job in one pipeline); the worker (`benchmarks/peer_workers.py`, the port has no CLI) is `bullmq.Worker(..., {{"connection": pooled, "concurrency": {peer_workers.CONCURRENCY}}})` where `pooled` is a `redis.asyncio.Redis` with a connection pool. Given a URL instead (the `bullmq-url` row), BullMQ opens a single-connection client, on which the {peer_workers.CONCURRENCY} jobs in flight serialise their round trips. Jobs are kept on completion (the default), their `processedOn`/`finishedOn` give the times.
- **SAQ**: its own worker (`python -m saq benchmarks.peer_workers.saq_settings`) at `concurrency` {peer_workers.CONCURRENCY} (default 10); SAQ has no bulk enqueue, so jobs are enqueued {PEER_ENQUEUE_CONCURRENCY} at a time in an `asyncio.gather` (as for arq); its job records give `started`/`completed`.
- **arq**: tuned as `max_jobs` {ARQ_TUNED['max_jobs']}, `poll_delay` {ARQ_TUNED['poll_delay']} s (its defaults poll every 0.5 s with 10 jobs in flight); **rq**: one job at a time by design, `SimpleWorker` avoids its fork per job.
- A job is a no-op in all of them; the same Redis server (own database numbers) serves everyone."""  # noqa: E501


def cpu_reading(r: Mapping[str, Any]) -> str:
    """What the CPU cost per request implies: the end-to-end rate this machine's CPUs can
    carry at all, and the rate one Redis core can, from the one-worker figures."""
    one = r["variants"].get("inferq-1")
    if one is None:
        return ""
    e2e, drain = one["e2e"], one["drain"]
    parts = {p: e2e[f"cpu_us_{p}"]["median"] for p in ("producer", "workers", "server")}
    if any(v is None or v <= 0 for v in parts.values()):
        return ""
    total = sum(parts.values())
    cpus = r["machine"].get("usable_cpus") or r["machine"].get("logical_cpus") or 1
    redis_drain = drain["cpu_us_server"]["median"] or 0.0
    largest = {"producer": "producer's (enqueue, then awaiting each result)",
               "workers": "worker's", "server": "Redis server's"}
    worker_drain = drain["cpu_us_workers"]["median"] or 0.0
    return (
        f"Reading: end to end, one request costs {parts['producer']:.0f} us of producer CPU, "
        f"{parts['workers']:.0f} us of worker CPU and {parts['server']:.0f} us of Redis CPU "
        f"(medians): {total:.0f} us in all, so this machine's {cpus} CPUs cannot carry more "
        f"than about {cpus * 1e6 / total:,.0f} requests/s end to end however the work is "
        f"spread, and one Redis core alone caps a queue near {1e6 / parts['server']:,.0f}/s. "
        f"Without a producer in the loop (drain), a worker needs {worker_drain:.0f} us and "
        f"Redis {redis_drain:.0f} us per request. The largest share is the "
        f"{largest[max(parts, key=lambda k: parts[k])]}.")


# ------------------------------------------------------------------------------ scenario


class Overhead(Scenario[OverheadConfig]):
    name = "overhead"
    title = "queue cost with a no-op model, vs BullMQ, SAQ, arq and rq"
    quick_help = "10,000 requests, few baseline jobs, 1 trial (~1 min)"
    config = OverheadConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=positive_int, default=ByMode(50_000, 10_000),
                            help="inferq requests per pass (default %(default)s)")
        parser.add_argument("--workers", dest="worker_counts", type=int_list, default=(1, 2, 4),
                            help="inferq worker process counts, comma-separated (default 1,2,4)")
        parser.add_argument("--chunk", type=positive_int, default=1000,
                            help="requests per enqueue_many call (default 1000)")
        parser.add_argument("--waiters", type=int, default=0,
                            help="coroutines awaiting results in enqueue order; 0 (default) = "
                                 "one task per request")
        parser.add_argument("--no-aof", dest="aof", action="store_false",
                            help="run the server without AOF (default: AOF on, appendfsync "
                                 "everysec), to see what persistence costs")
        add_worker_arguments(parser, max_batch_size=512, max_wait_ms=2.0)
        parser.add_argument("--arq-jobs", type=positive_int, default=ByMode(3_000, 500),
                            help="jobs per arq pass (default %(default)s)")
        parser.add_argument("--rq-jobs", type=positive_int, default=ByMode(2_000, 300),
                            help="jobs per rq SimpleWorker pass (default %(default)s)")
        parser.add_argument("--rq-fork-jobs", type=positive_int, default=ByMode(600, 150),
                            help="jobs per forking rq worker pass (default %(default)s)")
        parser.add_argument("--peer-jobs", type=positive_int, default=ByMode(5_000, 1_000),
                            help="jobs per BullMQ and per SAQ pass (default %(default)s)")
        parser.add_argument("--baselines", type=_baselines, default=tuple(BASELINES),
                            help=f"baselines to run, comma-separated, or 'none' (default "
                                 f"{','.join(BASELINES)}; skipped when not installed)")
        parser.set_defaults(warmup=ByMode(2_000, 1_000))

    def measure(self, run: Run[OverheadConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server(appendonly=cfg.aof)
        run.machine["versions"].update(arq=version("arq"), rq=version("rq"),
                                       bullmq=version("bullmq"), saq=version("saq"))
        spid = server.pid
        skipped = {b: f"{BASELINES[b][0]} is not installed" for b in cfg.baselines
                   if not available(BASELINES[b][0])}
        baselines_run = [b for b in cfg.baselines if b not in skipped]
        for b, why in skipped.items():
            say(f"skipping {b}: {why}")
        say(f"{self.name} benchmark: {cfg.requests} requests per inferq pass x {run.trials} "
            f"trial(s), inferq workers {list(cfg.worker_counts)}, baselines "
            f"{baselines_run or 'none'}")
        fleets = start_fleets(run.cleanup, url, cfg, run.log_dir)
        say("workers ready; warming up")
        warm_up(url, fleets, cfg)

        variants = [*fleets, *baselines_run]
        trials: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for trial in range(run.trials):
            shift = trial % len(variants)
            order = variants[shift:] + variants[:shift]
            say(f"trial {trial + 1}/{run.trials}: {' -> '.join(order)}")
            for variant in order:
                tag = f"t{trial}"
                if variant in fleets:
                    fleet = fleets[variant]
                    e2e = inferq_e2e_pass(url, fleet, cfg, f"{tag}e", spid)
                    drain = inferq_drain_pass(run.cleanup, url, fleet, cfg, f"{tag}d", spid)
                    trials[variant].append({"e2e": e2e, "drain": drain})
                    continue
                if variant.startswith("bullmq"):
                    trials[variant].append(bullmq_pass(
                        run.cleanup, url, cfg.peer_jobs, run.log_dir, spid, cfg.timeout_s,
                        pooled=variant == "bullmq"))
                    continue
                if variant == "saq":
                    trials[variant].append(saq_pass(run.cleanup, url, cfg.peer_jobs,
                                                    run.log_dir, spid, cfg.timeout_s))
                    continue
                if variant.startswith("arq"):
                    # arq's defaults make ~200 jobs/s: a quarter keeps the pass short.
                    quarter = variant == "arq-default"
                    jobs = max(100, cfg.arq_jobs // 4) if quarter else cfg.arq_jobs
                    baseline_pass = arq_pass
                else:
                    jobs = cfg.rq_jobs if variant == "rq-simple" else cfg.rq_fork_jobs
                    baseline_pass = rq_pass
                trials[variant].append(baseline_pass(run.cleanup, url, variant, jobs,
                                                     run.log_dir, spid, cfg.timeout_s))

        say("stopping the workers and the server")
        exit_codes = {w.worker_id: stop_child(w.child) for f in fleets.values() for w in f.workers}
        server.stop()
        return figures(fleets, trials, skipped, exit_codes)


SCENARIO = Overhead()
