"""What the scenarios that run the queue share: a server and ``inferq worker`` processes that
are always cleaned up, paused workers that are always resumed, a producer that enqueues and
awaits while watching the workers, fill-then-drain passes, Redis command and CPU counters, and
the statistics their reports are made of.

Everything here builds on ``harness.py``; heavy imports (torch) stay out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from benchmarks.harness import (
    BenchmarkFailed,
    Child,
    Cleanup,
    CpuProbe,
    dying_with_parent,
    percentiles,
    positive_int,
    say,
    stop_child,
    summary,
)
from benchmarks.loadgen import watched
from inferq.connection import sync_client
from inferq.embedded import EmbeddedServer
from inferq.protocol.keys import QueueKeys

if TYPE_CHECKING:
    from inferq.protocol.codec import Result

T = TypeVar("T")

#: Commands inferq's Lua scripts call (counted by ``INFO commandstats`` like any other). Every
#: other command in the counts was sent by a client: a network round trip, or part of one
#: pipeline. HSET/PEXPIRE/ZADD also come from a worker's periodic stats publication, a few per
#: second per worker, which is noise next to the per-request counts.
SCRIPT_INNER_COMMANDS = frozenset({
    "time", "zcard", "hget", "hmget", "exists", "incr", "zadd", "hset", "hdel", "rpush", "llen",
    "pexpire", "ltrim", "zrangebyscore", "zrem", "zpopmin", "zrange", "del", "hincrby",
    "zremrangebyrank", "zremrangebyscore", "xadd", "expire", "lrange", "zscore", "lpop",
})
SCRIPT_CALLS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"})


# -------------------------------------------------------------------- server, workers


class BenchServer(EmbeddedServer):
    """The embedded server with its default settings (AOF on, ``appendfsync everysec``),
    stopped by SIGTERM if the benchmark is killed before it can stop it."""

    def command(self) -> list[str]:
        return dying_with_parent(super().command())

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None


def start_server(cleanup: Cleanup, scenario: str, *, appendonly: bool = True
                 ) -> tuple[BenchServer, str]:
    data_dir = Path(tempfile.mkdtemp(prefix=f"inferq-bench-{scenario}-"))
    cleanup.on_close("server data", lambda: shutil.rmtree(data_dir, ignore_errors=True))
    server = BenchServer(data_dir, appendonly=appendonly)
    say(f"starting {Path(server.binary).name} (AOF {'on' if appendonly else 'off'}) in "
        f"{data_dir}")
    cleanup.on_close("server", server.stop)
    url = server.start()
    return server, url


@dataclass
class WorkerProc:
    """One ``python -m inferq worker`` process and the queue it serves."""

    worker_id: str
    model: str
    child: Child
    task: str = "embed"

    @property
    def pid(self) -> int:
        return self.child.process.pid

    @property
    def keys(self) -> QueueKeys:
        return QueueKeys.for_model(self.task, self.model)


def spawn_worker(cleanup: Cleanup, url: str, *, model_arg: str, worker_id: str,
                 log_dir: Path, flags: Sequence[str] = (), log_level: str = "WARNING",
                 task: str = "embed") -> WorkerProc:
    """``python -m inferq worker --task task --model model_arg --worker-id worker_id *flags``,
    logging to ``<log_dir>/<worker_id>.log``."""
    model = model_arg.partition("=")[0]
    argv = [sys.executable, "-m", "inferq", "--log-level", log_level, "worker",
            "--redis-url", url, *(["--task", task] if task != "embed" else []),
            "--model", model_arg, "--worker-id", worker_id, *flags]
    child = cleanup.spawn(f"worker {worker_id}", argv, log_path=log_dir / f"{worker_id}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Registered after the spawn, so it runs before the stop (newest first): a worker left
    # paused by an interrupted pass is resumed, or it would never act on its SIGTERM.
    cleanup.on_close(f"resume {worker_id}", lambda: _continue(child))
    return WorkerProc(worker_id, model, child, task)


def spawn_workers(cleanup: Cleanup, url: str, worker_ids: Sequence[str], *, model_arg: str,
                  log_dir: Path, flags: Sequence[str]) -> list[WorkerProc]:
    """One worker per id, all on the queue of ``model_arg``, once all are registered."""
    workers = [spawn_worker(cleanup, url, model_arg=model_arg, worker_id=worker_id,
                            log_dir=log_dir, flags=flags) for worker_id in worker_ids]
    wait_registered(url, workers)
    return workers


def stop_all(server: BenchServer, workers: Mapping[str, WorkerProc]) -> dict[str, int | None]:
    """Stop ``workers`` (name -> process), then the server; the workers' exit codes."""
    say("stopping the workers and the server")
    codes = {name: stop_child(w.child) for name, w in workers.items()}
    server.stop()
    return codes


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (LitServe's API server and inference worker,
    uvicorn's worker processes)."""
    pids, todo = [], [pid]
    while todo:
        pids.append(p := todo.pop())
        for entry in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rfind(")") + 2:].split()[1]) == p:
                    todo.append(int(entry.name))
    return pids


def cpu_by_role(cpu: Mapping[str, float | None], n: int) -> dict[str, float | None]:
    """CPU microseconds per request of each role (``role.i`` keys: the sum over its
    processes)."""
    roles: dict[str, float] = {}
    for key, value in cpu.items():
        if key not in ("other_load", "wall_s") and value is not None:
            roles[key.split(".")[0]] = roles.get(key.split(".")[0], 0.0) + value
    return {role: round(v / max(n, 1) * 1e6, 1) for role, v in roles.items()}


def spawn_server(cleanup: Cleanup, name: str, argv: Sequence[str], log_dir: Path, url: str,
                 env: Mapping[str, str] | None = None, timeout_s: float = 180.0) -> Child:
    """A server process, its whole process group killed at the end, once ``url`` answers 200."""
    child = cleanup.spawn(name, argv, log_path=log_dir / f"{name}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    # In a session of its own: its group is its own children, nothing else.
    cleanup.on_close(f"{name} group", lambda: _kill_group(child.process.pid))
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return child
        if not child.alive() or time.monotonic() > deadline:
            raise BenchmarkFailed(f"{name}: {url} not ready\n{child.log_tail()}")
        time.sleep(0.2)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def free_port() -> int:
    from inferq.embedded import free_port as free

    return int(free())


def gateway(cleanup: Cleanup, url: str, log_dir: Path, *, name: str = "gateway",
            env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> tuple[Child, int]:
    """``python -m inferq.gateway`` on a free port over ``url``, once its /healthz answers;
    the child and its port."""
    port = free_port()
    child = spawn_server(cleanup, name, [sys.executable, "-m", "inferq.gateway", "--host",
                                         "127.0.0.1", "--port", str(port), *args], log_dir,
                         f"http://127.0.0.1:{port}/healthz",
                         env={"INFERQ_REDIS_URL": url, **(env or {})})
    return child, port


def litserve(cleanup: Cleanup, log_dir: Path, max_batch_size: int, batch_timeout_s: float
             ) -> tuple[Child, int]:
    """LitServe serving MiniLM (``serve_litserve.py``) on a free port, once it answers."""
    port = free_port()
    child = spawn_server(cleanup, "litserve", [
        sys.executable, "-m", "benchmarks.serve_litserve", "--port", str(port),
        "--max-batch-size", str(max_batch_size), "--batch-timeout", f"{batch_timeout_s:g}"],
        log_dir, f"http://127.0.0.1:{port}/health")
    return child, port


def sleep_model(model: str, batch_ms: float, item_ms: float) -> str:
    """``--model`` of the built-in ``sleep`` model: a fixed time per batch and per request, no
    CPU (it models a GPU)."""
    return f"{model}=builtin:sleep?batch_ms={batch_ms:g}&item_ms={item_ms:g}"


def window_flags(max_batch_size: int, max_wait_ms: float) -> list[str]:
    """A window worker's batch size and wait, with no token budget (the built-in models have
    no tokenizer)."""
    return ["--max-batch-size", str(max_batch_size), "--max-wait-ms", f"{max_wait_ms:g}",
            "--max-batch-tokens", "0"]


@dataclass(frozen=True)
class SleepWindow:
    """The config fields of ``add_worker_arguments`` with the sleep model, and what they
    imply; a scenario's config that runs sleep-model workers extends it."""

    batch_ms: float
    item_ms: float
    max_batch_size: int
    max_wait_ms: float

    @property
    def full_batch_ms(self) -> float:
        return self.batch_ms + self.item_ms * self.max_batch_size

    @property
    def worker_capacity(self) -> float:
        """Requests/s one worker serves running full batches back to back."""
        return self.max_batch_size / (self.full_batch_ms / 1e3)


def add_worker_arguments(parser: argparse.ArgumentParser, *, max_batch_size: int,
                         max_wait_ms: float, batch_ms: float | None = None,
                         item_ms: float = 0.0) -> None:
    """The workers' ``--max-batch-size`` and ``--max-wait-ms`` and, with ``batch_ms``, the
    sleep model's ``--batch-ms`` and ``--item-ms``."""
    if batch_ms is not None:
        parser.add_argument("--batch-ms", type=float, default=batch_ms,
                            help="sleep model: milliseconds per batch (default %(default)g)")
        parser.add_argument("--item-ms", type=float, default=item_ms,
                            help="sleep model: extra milliseconds per request "
                                 "(default %(default)g)")
    parser.add_argument("--max-batch-size", type=positive_int, default=max_batch_size,
                        help="workers' --max-batch-size (default %(default)s)")
    parser.add_argument("--max-wait-ms", type=float, default=max_wait_ms,
                        help="workers' --max-wait-ms, the window (default %(default)g)")


def _continue(child: Child) -> None:
    if child.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.process.pid, signal.SIGCONT)


def check_alive(workers: Iterable[WorkerProc]) -> None:
    for w in workers:
        if not w.child.alive():
            raise BenchmarkFailed(f"worker {w.worker_id} exited with code "
                                  f"{w.child.process.returncode}:\n{w.child.log_tail()}")


def wait_registered(url: str, workers: Sequence[WorkerProc], timeout_s: float = 120.0) -> None:
    """Until every worker has marked itself alive in its queue's worker set (it does so once
    its model is loaded, right before it starts claiming)."""
    client = sync_client(url)  # a cluster client on a Redis Cluster
    deadline = time.monotonic() + timeout_s
    try:
        pending = list(workers)
        while pending:
            check_alive(pending)
            pipe = client.pipeline(transaction=False)
            for w in pending:
                pipe.zscore(w.keys.workers, w.worker_id)
            scores = pipe.execute()
            pending = [w for w, s in zip(pending, scores, strict=True) if s is None]
            if pending and time.monotonic() > deadline:
                raise BenchmarkFailed(
                    f"worker {pending[0].worker_id} not ready within {timeout_s:.0f} s\n"
                    f"{pending[0].child.log_tail()}")
            if pending:
                time.sleep(0.05)
    finally:
        client.close()


@contextlib.contextmanager
def paused(cleanup: Cleanup, pids: Sequence[int]) -> Iterator[Callable[[Sequence[int]], None]]:
    """SIGSTOP ``pids`` for the block; yields ``resume(pids)`` to let some go early. Every one is
    resumed when the block ends, and by ``cleanup`` if the run dies inside it (a stopped process
    would not act on the SIGTERM that stops it)."""
    stopped: set[int] = set()

    def resume(which: Sequence[int]) -> None:
        for pid in which:
            if pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                stopped.discard(pid)

    cleanup.on_close("paused workers", lambda: resume(list(stopped)))
    try:
        for pid in pids:
            stopped.add(pid)  # first: an interrupt between the two still resumes it
            os.kill(pid, signal.SIGSTOP)
        yield resume
    finally:
        resume(list(stopped))


def queue_probe(server: int | None, pids: Sequence[int]) -> CpuProbe:
    """A ``CpuProbe`` of this process (the producer), the server and the workers ``pids``
    (``worker0``, ``worker1``, ...), with the children they waited for."""
    return CpuProbe({"producer": None, "server": server,
                     **{f"worker{i}": pid for i, pid in enumerate(pids)}}, children=True)


def sum_cpu(cpu: Mapping[str, float | None], prefix: str) -> float | None:
    values = [v for k, v in cpu.items() if k.startswith(prefix)]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


# ------------------------------------------------------------------------------ producer


def watchdog(workers: Sequence[WorkerProc], timeout_s: float) -> Callable[[], None]:
    """A check that fails the run (with the log) when a worker died or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s

    def check() -> None:
        check_alive(workers)
        if time.monotonic() > deadline:
            raise BenchmarkFailed(f"no complete results within {timeout_s:.0f} s\n"
                                  f"{workers[0].child.log_tail()}")
    return check


async def gather_watched(tasks: Sequence[asyncio.Future[T]], workers: Sequence[WorkerProc],
                          timeout_s: float) -> list[T]:
    """All results, failing fast (with the log) if a worker dies or time runs out."""
    return list(await watched(asyncio.gather(*tasks), watchdog(workers, timeout_s)))


async def enqueue_and_await(url: str, model: str, prompts: Sequence[str], chunk: int,
                             workers: Sequence[WorkerProc], timeout_s: float, waiters: int = 0,
                             together: bool = False) -> tuple[list[Result], float, float]:
    """Enqueue in chunks while the results are awaited: by one task per handle (``waiters``
    0), by ``waiters`` coroutines taking the handles in enqueue order, or (``together``) by one
    ``AsyncClient.results`` per chunk. Returns the results, the seconds from the first enqueue
    to the last result, and the seconds enqueueing took."""
    from inferq.producer.aio import AsyncClient, AsyncHandle

    async with AsyncClient(url) as client:
        tasks: list[asyncio.Future[Result]] = []
        chunks: list[asyncio.Future[list[Result]]] = []
        handles: asyncio.Queue[tuple[int, AsyncHandle] | None] = asyncio.Queue()
        results: list[Result | None] = [None] * len(prompts)

        async def waiter() -> None:
            while (item := await handles.get()) is not None:
                results[item[0]] = await item[1].result()

        consumers = [asyncio.ensure_future(waiter()) for _ in range(0 if together else waiters)]
        t0 = time.perf_counter()
        for start in range(0, len(prompts), chunk):
            batch = await client.enqueue_many(prompts[start:start + chunk], model=model)
            if together:
                chunks.append(asyncio.ensure_future(client.results(batch)))
            elif waiters:
                for offset, h in enumerate(batch):
                    handles.put_nowait((start + offset, h))
            else:
                tasks += [asyncio.ensure_future(h.result()) for h in batch]
        enqueued = time.perf_counter() - t0
        for _ in consumers:
            handles.put_nowait(None)
        if together:
            done = [r for chunk_results in await gather_watched(chunks, workers, timeout_s)
                    for r in chunk_results]
        elif waiters:
            await gather_watched(consumers, workers, timeout_s)
            done = [r for r in results if r is not None]
        else:
            done = await gather_watched(tasks, workers, timeout_s)
        return done, time.perf_counter() - t0, enqueued


def check_ok(results: Sequence[Result], n: int, what: str, *,
             outputs: Sequence[Any] | None = None) -> None:
    """Fail unless there are ``n`` results and every one is ok (and, with ``outputs``, has
    the output of the same index)."""
    bad = [r for i, r in enumerate(results) if r.status.value != "ok"
           or (outputs is not None and (i >= len(outputs) or r.output != outputs[i]))]
    if bad or len(results) != n:
        raise BenchmarkFailed(f"{what}: {len(bad)} failed or wrong of {len(results)} "
                              f"(expected {n} ok), e.g. {bad[:1]!r}")


def closed_loop(url: str, worker: WorkerProc, texts: Sequence[str], timeout_s: float
                ) -> tuple[float, list[Result]]:
    """Every text enqueued at once (chunks of 100), all awaited by 8 waiters: requests/s."""
    results, seconds, _ = asyncio.run(enqueue_and_await(
        url, worker.model, list(texts), 100, [worker], timeout_s, waiters=8))
    check_ok(results, len(texts), f"{worker.worker_id} burst")
    return len(results) / seconds, results


def warm_up(url: str, workers: Mapping[str, WorkerProc], texts: Sequence[str], *,
            ready_timeout_s: float, timeout_s: float) -> dict[str, int]:
    """Wait until every worker is registered (its model loaded), then send each a burst, so
    torch has seen the shapes and the adaptive window has fitted its latency model: all of
    ``texts`` to the first worker, a quarter (at least 8) to the others. Returns how many
    requests each got."""
    wait_registered(url, list(workers.values()), timeout_s=ready_timeout_s)
    sent: dict[str, int] = {}
    for variant, worker in workers.items():
        part = texts if not sent else texts[: max(8, len(texts) // 4)]
        closed_loop(url, worker, part, timeout_s)
        sent[variant] = len(part)
        say(f"  worker {variant} warmed up")
    return sent


def pipelined(client: redis.Redis, ids: Sequence[str], call: Callable[[Any, str], Any],
              chunk: int = 5000) -> list[Any]:
    """``call(pipeline, id)`` for each of ``ids``, sent in pipelines of ``chunk``; the replies."""
    replies: list[Any] = []
    for start in range(0, len(ids), chunk):
        pipe = client.pipeline(transaction=False)
        for request_id in ids[start:start + chunk]:
            call(pipe, request_id)
        replies += pipe.execute()
    return replies


def read_results(client: redis.Redis, keys: QueueKeys, ids: Sequence[str]) -> list[Result]:
    """The stored results of ``ids``, read with pipelined LINDEX (after a timed pass)."""
    from inferq.protocol.codec import decode_result

    raws = pipelined(client, ids, lambda pipe, i: pipe.lindex(keys.result(i), 0))
    missing = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
    if missing:
        raise BenchmarkFailed(f"no result stored for request {missing[0]}")
    return [decode_result(raw) for raw in raws]


def read_written(client: redis.Redis, keys: QueueKeys, ids: Sequence[str]) -> list[Result]:
    """The results of those of ``ids`` that have one yet (the rest still wait or run)."""
    written = pipelined(client, ids, lambda pipe, i: pipe.exists(keys.result(i)))
    return read_results(client, keys, [i for i, e in zip(ids, written, strict=True) if e])


@dataclass
class Drained:
    """One fill-then-drain pass: the results in enqueue order and what it cost."""

    ids: list[str]
    results: list[Result]
    #: First claim -> last result written, Redis clock.
    seconds: float
    wall_s: float
    cpu: dict[str, float | None]
    redis_fill: RedisDelta
    redis_drain: RedisDelta

    @property
    def throughput(self) -> float:
        return len(self.results) / max(self.seconds, 1e-3)


def fill_and_drain(cleanup: Cleanup, url: str, model: str, prompts: Sequence[str], *,
                   chunk: int, paused_workers: Sequence[WorkerProc],
                   active: Sequence[WorkerProc], server: int | None, timeout_s: float,
                   poll_s: float = 0.01, priority: int = 0, tenant: str | None = None
                   ) -> Drained:
    """Pause ``paused_workers`` (SIGSTOP), enqueue ``prompts`` (``AsyncClient.enqueue_many`` in
    chunks), resume ``active`` and wait until the queue is empty; the others stay paused until
    it is. Measures the drain alone: the producer only polls the queue depth meanwhile. The
    throughput comes from the results' own claim and finish times (Redis clock)."""
    from inferq.producer.aio import AsyncClient

    client = redis.Redis.from_url(url)
    keys = QueueKeys.for_model(active[0].task, model)

    async def fill() -> list[str]:
        ids: list[str] = []
        async with AsyncClient(url) as producer:
            for start in range(0, len(prompts), chunk):
                handles = await producer.enqueue_many(prompts[start:start + chunk],
                                                      model=model, priority=priority,
                                                      tenant=tenant)
                ids += [h.id for h in handles]
        return ids

    probe = queue_probe(server, [w.pid for w in active])
    try:
        with paused(cleanup, [w.pid for w in paused_workers]) as resume:
            start_fill = redis_snapshot(client)
            ids = asyncio.run(fill())
            before = redis_snapshot(client)
            polls = 0
            probe.start()
            t0 = time.perf_counter()
            resume([w.pid for w in active])
            deadline = time.monotonic() + timeout_s
            while queue_depth(client, keys):
                polls += 1
                if time.monotonic() > deadline:
                    raise BenchmarkFailed(f"{model}: queue not drained in {timeout_s:.0f} s")
                check_alive(active)
                time.sleep(poll_s)
            wall = time.perf_counter() - t0
            cpu = probe.stop()
            after = redis_snapshot(client)
        results = read_results(client, keys, ids)
    finally:
        client.close()
    n = len(ids)
    return Drained(ids=ids, results=results, seconds=served_s(results), wall_s=wall, cpu=cpu,
                   redis_fill=redis_delta(start_fill, before, n),
                   redis_drain=redis_delta(before, after, n, own={"zcard": 3 * (polls + 1)}))


# ------------------------------------------------------------------------ Redis counters


@dataclass
class RedisSnapshot:
    calls: dict[str, int]
    usec: dict[str, int]
    total_commands: int
    cpu_s: float
    at: float


def redis_snapshot(client: redis.Redis) -> RedisSnapshot:
    """``INFO commandstats``, ``INFO stats`` and ``INFO cpu`` (server CPU: user + system)."""
    info = client.info("everything")
    stats = {k.removeprefix("cmdstat_").lower(): v for k, v in info.items()
             if k.startswith("cmdstat_") and isinstance(v, dict)}
    return RedisSnapshot(calls={k: int(v["calls"]) for k, v in stats.items()},
                         usec={k: int(v.get("usec", 0)) for k, v in stats.items()},
                         total_commands=int(info["total_commands_processed"]),
                         cpu_s=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
                         at=time.perf_counter())


@dataclass
class RedisDelta:
    """Redis work during one timed pass, per request."""

    requests: int
    seconds: float
    calls: dict[str, int]
    commands_per_request: float
    client_commands_per_request: float
    script_calls_per_request: float
    ops_per_s: float
    cpu_s: float
    cpu_us_per_request: float
    cpu_share: float
    by_command_per_request: dict[str, float] = field(default_factory=dict)
    #: Microseconds Redis spent executing each command, per request (a script's time includes
    #: its inner commands, which are also listed on their own); the rest of ``cpu_us`` goes to
    #: networking, the event loop and the AOF.
    usec_per_request: dict[str, float] = field(default_factory=dict)


def redis_delta(before: RedisSnapshot, after: RedisSnapshot, requests: int,
                own: Mapping[str, int] | None = None) -> RedisDelta:
    """Deltas between two snapshots. ``INFO`` (the snapshots themselves) is left out, and
    ``own`` counts the benchmark's own probes to subtract (e.g. the ZCARDs it polls a draining
    queue with)."""
    calls = {k: after.calls.get(k, 0) - before.calls.get(k, 0) - (own or {}).get(k, 0)
             for k in after.calls if k != "info"}
    calls = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v > 0}
    n = max(requests, 1)
    total = sum(calls.values())
    client = sum(v for k, v in calls.items() if k not in SCRIPT_INNER_COMMANDS)
    scripts = sum(v for k, v in calls.items() if k in SCRIPT_CALLS)
    seconds = max(after.at - before.at, 1e-9)
    cpu = max(after.cpu_s - before.cpu_s, 0.0)
    return RedisDelta(
        requests=requests, seconds=seconds, calls=calls,
        commands_per_request=total / n, client_commands_per_request=client / n,
        script_calls_per_request=scripts / n, ops_per_s=total / seconds, cpu_s=cpu,
        cpu_us_per_request=cpu / n * 1e6, cpu_share=cpu / seconds,
        by_command_per_request={k: round(v / n, 4) for k, v in calls.items()},
        usec_per_request={k: round((after.usec.get(k, 0) - before.usec.get(k, 0)) / n, 3)
                          for k in calls},
    )


def queue_depth(client: redis.Redis, keys: QueueKeys) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.pending)
    pipe.zcard(keys.inflight)
    pipe.zcard(keys.delayed)
    return sum(int(x) for x in pipe.execute())


# --------------------------------------------------------------------------- statistics


def pcts(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """``percentiles`` with the maximum and the count."""
    out = percentiles(values, qs)
    out["max"] = max(values) if values else None
    out["n"] = float(len(values))
    return out


def at(data: Any, *path: str) -> Any:
    """The value at ``path`` (nested keys) in ``data``; None where a key is missing."""
    for key in path:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def summarize_trials(trials: Sequence[Mapping[str, Any]], path: Sequence[str]
                     ) -> dict[str, Any]:
    """``summary`` of the number at ``path`` (nested keys) in each trial, skipping gaps."""
    return summary([v for t in trials if isinstance(v := at(t, *path), int | float)])


def median_at(trials: Sequence[Mapping[str, Any]], *path: str) -> float | None:
    """The median over ``trials`` of the number at ``path`` (nested keys); None without one."""
    median: float | None = summarize_trials(trials, path)["median"]
    return median


def summarize_fields(trials: Sequence[Mapping[str, Any]], *fields: str) -> dict[str, Any]:
    """``summarize_trials`` of each field, a dotted path: ``a.b`` is named ``a_b``,
    ``name=a.b`` is named ``name``."""
    out: dict[str, Any] = {}
    for f in fields:
        name, _, path = f.rpartition("=")
        out[name or path.replace(".", "_")] = summarize_trials(trials, path.split("."))
    return out


def served_s(results: Iterable[Any]) -> float:
    """Seconds from the first claim to the last finish of ``results``, on the Redis clock."""
    done = [r for r in results if r.started_ms is not None and r.finished_ms is not None]
    return (max(r.finished_ms for r in done) - min(r.started_ms for r in done)) / 1e3


def batch_groups(results: Iterable[Any]) -> dict[tuple[Any, Any, Any], list[int]]:
    """The batches reconstructed from results, as the indexes of their requests: one forward
    pass = one (worker, finish time, compute time) triple, which every request of it shares."""
    groups: dict[tuple[Any, Any, Any], list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault((r.worker, r.finished_ms, r.compute_ms), []).append(i)
    return groups


def batches_of(results: Iterable[Any]) -> Counter[int]:
    """How many batches ran at each size (``batch_groups``)."""
    return Counter(len(rows) for rows in batch_groups(results).values())


def merge_counters(counters: Iterable[Mapping[Any, int]]) -> dict[int, int]:
    total: Counter[int] = Counter()
    for c in counters:
        total.update({int(k): int(v) for k, v in c.items()})
    return dict(sorted(total.items()))


# ----------------------------------------------------------------------------- display


def load_str(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"
