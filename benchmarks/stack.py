"""What the queue scenarios (``embed-load``, ``overhead``, ``priority``, ``scaleout``) share:
a server and worker processes that are always cleaned up, paused workers that are always
resumed, Redis command and CPU counters, and the common parts of their reports.

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
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from benchmarks.harness import (
    Child,
    Cleanup,
    CpuProbe,
    command_line,
    describe_machine,
    dying_with_parent,
    now_utc,
    percentile,
    say,
    summary,
    update_results_md,
    write_json,
)
from inferq.embedded import EmbeddedServer
from inferq.protocol.keys import QueueKeys

if TYPE_CHECKING:
    from inferq.protocol.codec import Result

T = TypeVar("T")
BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "out"
DEFAULT_RESULTS_MD = BENCH_DIR / "RESULTS.md"
#: Plots referenced by RESULTS.md are copied here (committed), next to RESULTS.md.
PLOTS_DIR = BENCH_DIR / "plots"
#: A measurement during which other processes used more than this share of the machine is
#: flagged as disturbed (the same threshold as ``embed``).
DISTURBED_LOAD = 0.10

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


class BenchmarkFailed(RuntimeError):
    """A worker died or stopped answering, or a result was wrong; the message says which."""


# ------------------------------------------------------------------------------ arguments


def add_common_arguments(parser: argparse.ArgumentParser, name: str, quick_help: str) -> None:
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--trials", type=int, default=None,
                        help="repeated trials; medians and min..max are reported "
                             "(default 3; 1 with --quick)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for {name}.json, plots and logs (default benchmarks/out)")
    parser.add_argument("--results-md", type=Path, default=DEFAULT_RESULTS_MD,
                        help="RESULTS.md to update (default benchmarks/RESULTS.md); its plots "
                             "go to a plots/ folder next to it")
    parser.add_argument("--no-results-md", action="store_true",
                        help="do not touch RESULTS.md or its plots folder")


def positive(scenario: str, name: str, value: float) -> float:
    if not value > 0:
        raise SystemExit(f"benchmarks {scenario}: --{name} must be > 0, got {value}")
    return value


def int_list(scenario: str, name: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"benchmarks {scenario}: --{name} must be comma-separated integers, "
                         f"got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"benchmarks {scenario}: bad --{name} {text!r}")
    return values


def float_list(scenario: str, name: str, text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"benchmarks {scenario}: --{name} must be comma-separated numbers, "
                         f"got {text!r}") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"benchmarks {scenario}: bad --{name} {text!r}")
    return values


# ------------------------------------------------------------------------------- running


def run_scenario(name: str, body: Callable[[Cleanup], int]) -> int:
    """Run ``body`` with a ``Cleanup`` that stops every child however the run ends; Ctrl-C and
    SIGTERM exit 130, a ``BenchmarkFailed`` exits 1 with its message."""
    cleanup = Cleanup()
    cleanup.install_signal_handlers()
    try:
        return body(cleanup)
    except KeyboardInterrupt as exc:
        print(f"\nbenchmarks {name}: interrupted ({exc or 'Ctrl-C'}); stopping workers and the "
              "server", file=sys.stderr)
        return 130
    except Exception as exc:
        leaf = first_leaf(exc)
        if not isinstance(leaf, BenchmarkFailed):
            raise
        print(f"\nbenchmarks {name}: failed: {leaf}", file=sys.stderr)
        return 1
    finally:
        cleanup.close()


def run_reported(name: str, produce: Callable[[Cleanup], Mapping[str, Any]],
                 text: Callable[[Mapping[str, Any]], str]) -> int:
    """``run_scenario`` for a scenario that makes a report: printed as text at the end."""
    def body(cleanup: Cleanup) -> int:
        report = produce(cleanup)
        print()
        print(text(report))
        return 0

    return run_scenario(name, body)


def save_report(name: str, report: dict[str, Any], out: Path, results_md: Path | None, *,
                plots: Callable[[Path], Sequence[Path]],
                markdown: Callable[[list[str], Path], str]) -> None:
    """Draw the plots (``plots(folder)``), write ``<out>/<name>.json`` and, with
    ``results_md``, the scenario's section of RESULTS.md (``markdown(plot links, json)``)."""
    out.mkdir(parents=True, exist_ok=True)
    report["plots"] = [str(p) for p in plots(out / "plots")]
    json_path = out / f"{name}.json"
    write_json(json_path, report)
    say(f"wrote {json_path}")
    if results_md is not None:
        links = publish_plots([Path(p) for p in report["plots"]], results_md)
        update_results_md(name, markdown(links, json_path), results_md)
        say(f"updated {results_md}")


def first_leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups, e.g. from a TaskGroup."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class BenchServer(EmbeddedServer):
    """The embedded server with its default settings (AOF on, ``appendfsync everysec``),
    stopped by SIGTERM if the benchmark is killed before it can stop it."""

    def command(self) -> list[str]:
        return dying_with_parent(super().command())


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


def server_pid(server: EmbeddedServer) -> int | None:
    return server.process.pid if server.process else None


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
                 log_dir: Path, flags: Sequence[str] = (), log_level: str = "WARNING"
                 ) -> WorkerProc:
    """``python -m inferq worker --model model_arg --worker-id worker_id *flags``."""
    model = model_arg.partition("=")[0]
    argv = [sys.executable, "-m", "inferq", "--log-level", log_level, "worker",
            "--redis-url", url, "--model", model_arg, "--worker-id", worker_id, *flags]
    child = cleanup.spawn(f"worker {worker_id}", argv, log_path=log_dir / f"{worker_id}.log",
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # Registered after the spawn, so it runs before the stop (newest first): a worker left
    # paused by an interrupted pass is resumed, or it would never act on its SIGTERM.
    cleanup.on_close(f"resume {worker_id}", lambda: _continue(child))
    return WorkerProc(worker_id, model, child)


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
    client = redis.Redis.from_url(url)
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


def sum_cpu(cpu: Mapping[str, float | None], prefix: str) -> float | None:
    values = [v for k, v in cpu.items() if k.startswith(prefix)]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


# ------------------------------------------------------------------------------ producer


async def gather_watched(tasks: Sequence[asyncio.Future[T]], workers: Sequence[WorkerProc],
                          timeout_s: float) -> list[T]:
    """All results, failing fast (with the log) if a worker dies or time runs out."""
    gathered = asyncio.gather(*tasks)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            done, _ = await asyncio.wait({gathered}, timeout=0.5)
            if done:
                return list(gathered.result())
            check_alive(workers)
            if time.monotonic() > deadline:
                raise BenchmarkFailed(f"no complete results within {timeout_s:.0f} s\n"
                                      f"{workers[0].child.log_tail()}")
    finally:
        if not gathered.done():
            gathered.cancel()


async def enqueue_and_await(url: str, model: str, prompts: Sequence[str], chunk: int,
                             workers: Sequence[WorkerProc], timeout_s: float, waiters: int = 0
                             ) -> tuple[list[Result], float, float]:
    """Enqueue in chunks while the results are awaited: by one task per handle (``waiters``
    0), or by ``waiters`` coroutines taking the handles in enqueue order. Returns the results,
    the seconds from the first enqueue to the last result, and the seconds enqueueing took."""
    from inferq.producer.aio import AsyncClient, AsyncHandle

    async with AsyncClient(url) as client:
        tasks: list[asyncio.Future[Result]] = []
        handles: asyncio.Queue[tuple[int, AsyncHandle] | None] = asyncio.Queue()
        results: list[Result | None] = [None] * len(prompts)

        async def waiter() -> None:
            while (item := await handles.get()) is not None:
                results[item[0]] = await item[1].result()

        consumers = [asyncio.ensure_future(waiter()) for _ in range(waiters)]
        t0 = time.perf_counter()
        for start in range(0, len(prompts), chunk):
            batch = await client.enqueue_many(prompts[start:start + chunk], model=model)
            if waiters:
                for offset, h in enumerate(batch):
                    handles.put_nowait((start + offset, h))
            else:
                tasks += [asyncio.ensure_future(h.result()) for h in batch]
        enqueued = time.perf_counter() - t0
        for _ in consumers:
            handles.put_nowait(None)
        if waiters:
            await gather_watched(consumers, workers, timeout_s)
            done = [r for r in results if r is not None]
        else:
            done = await gather_watched(tasks, workers, timeout_s)
        return done, time.perf_counter() - t0, enqueued


def read_results(client: redis.Redis, keys: QueueKeys, ids: Sequence[str],
                 chunk: int = 5000) -> list[Result]:
    """The stored results of ``ids``, read with pipelined LINDEX (after a timed pass)."""
    from inferq.protocol.codec import decode_result

    out: list[Result] = []
    for start in range(0, len(ids), chunk):
        pipe = client.pipeline(transaction=False)
        for request_id in ids[start:start + chunk]:
            pipe.lindex(keys.result(request_id), 0)
        for request_id, raw in zip(ids[start:start + chunk], pipe.execute(), strict=True):
            if raw is None:
                raise BenchmarkFailed(f"no result stored for request {request_id}")
            out.append(decode_result(raw))
    return out


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
                   poll_s: float = 0.01, priority: int = 0) -> Drained:
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
                                                      model=model, priority=priority)
                ids += [h.id for h in handles]
        return ids

    probe = CpuProbe({"producer": None, "server": server,
                   **{f"worker{i}": w.pid for i, w in enumerate(active)}}, children=True)
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
    first = min(r.started_ms for r in results if r.started_ms is not None)
    last = max(r.finished_ms for r in results if r.finished_ms is not None)
    n = len(ids)
    return Drained(ids=ids, results=results, seconds=(last - first) / 1e3, wall_s=wall, cpu=cpu,
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
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in qs}
    out["max"] = max(values) if values else None
    out["n"] = float(len(values))
    return out


def summarize_trials(trials: Sequence[Mapping[str, Any]], path: Sequence[str]
                     ) -> dict[str, Any]:
    """``summary`` of the number at ``path`` (nested keys) in each trial, skipping gaps."""
    values: list[float] = []
    for t in trials:
        v: Any = t
        for key in path:
            v = v.get(key) if isinstance(v, Mapping) else None
        if isinstance(v, int | float):
            values.append(float(v))
    return summary(values)


def scaled(s: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A ``summary`` with every figure multiplied by ``factor`` (e.g. 100 for percent)."""
    out: dict[str, Any] = {}
    for key, value in s.items():
        if isinstance(value, list):
            out[key] = [x * factor for x in value]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value * factor
        else:
            out[key] = value
    return out


def batches_of(results: Iterable[Any]) -> Counter[int]:
    """Batch sizes reconstructed from results: one forward pass = one (worker, finish time,
    compute time) triple, which every request of the batch shares."""
    groups: Counter[tuple[Any, Any, Any]] = Counter()
    for r in results:
        groups[(r.worker, r.finished_ms, r.compute_ms)] += 1
    return Counter(groups.values())


def merge_counters(counters: Iterable[Mapping[Any, int]]) -> dict[int, int]:
    total: Counter[int] = Counter()
    for c in counters:
        total.update({int(k): int(v) for k, v in c.items()})
    return dict(sorted(total.items()))


# -------------------------------------------------------------------------------- reports


def header_lines(report: Mapping[str, Any], title: str) -> str:
    """The section title, quick/disturbed warnings, command, date, machine."""
    m = report["machine"]
    quick = ("\n> **Quick run** (`--quick`): a smoke test with few requests and one trial, not "
             "a measurement.\n" if report["quick"] else "")
    noise = report.get("noise", {})
    disturbed = ("" if not noise.get("disturbed") else
                 f"\n> **Disturbed run**: other processes used up to "
                 f"{noise['max_other_load']:.0%} of the machine during a measurement; "
                 "wall-clock figures are unreliable.\n")
    dirty = " (dirty tree)" if m["git"]["dirty"] else ""
    return (f"## {title}\n{quick}{disturbed}\n"
            f"- Command: `{report['command']}` ({report['elapsed_s']:.0f} s)\n"
            f"- Date: {report['date']}; git {str(m['git']['commit'])[:10]}{dirty}\n"
            f"- Machine: {describe_machine(m)}; load average {m['load_avg_1_5_15']} at start, "
            f"{report['load_avg_end']} at end\n")


def noise_of(loads: Iterable[float | None]) -> dict[str, Any]:
    values = [x for x in loads if x is not None]
    worst = max(values, default=None)
    return {"max_other_load": worst, "disturbed": (worst or 0.0) > DISTURBED_LOAD}


def base_report(scenario: str, quick: bool, machine: dict[str, Any], started: float
                ) -> dict[str, Any]:
    return {"scenario": scenario, "command": command_line(), "date": now_utc(), "quick": quick,
            "elapsed_s": round(time.monotonic() - started, 1), "machine": machine,
            "load_avg_end": [round(x, 2) for x in os.getloadavg()]}


def publish_plots(plots: Sequence[Path], results_md: Path | None) -> list[str]:
    """Copy plots next to RESULTS.md (``plots/``) and return their links relative to it; when
    RESULTS.md is not updated, links point at the files under ``out/``."""
    if results_md is None:
        return [str(p) for p in plots]
    folder = results_md.resolve().parent / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for p in plots:
        shutil.copyfile(p, folder / p.name)
        links.append(f"plots/{p.name}")
    return links


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(BENCH_DIR.parent))
    except ValueError:
        return str(path)


def load_str(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
