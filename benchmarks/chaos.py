"""Scenario ``chaos``: real worker processes against a real server with AOF, while faults are
injected.

    python -m benchmarks chaos            # the long run: 100,000 requests, 4 workers,
                                          # 100 kills, 10 stops, 3 Redis restarts (~4 min)
    python -m benchmarks chaos --quick    # 3,000 requests, 3 workers, 5 kills (~20 s)
    python -m benchmarks chaos --short --out DIR   # the test suite's run (1,200 requests,
                                                    # 2 workers, 3 kills, ~10 s)

Faults, on a schedule spread over the run: SIGKILLs of a random worker (a new one is started
in its place), SIGSTOPs of a worker for 2.5 leases (then SIGCONT), restarts of the Redis
server, plus poison requests (the model raises on them) and requests whose deadline passes in
the queue. The workers run with the default lease unless ``--lease-ms`` is given. The report
counts every outcome and, above all, LOST requests: accepted by enqueue but neither answered
nor still queued at the end. It must be 0.

The sleep model records every request it starts to run (``record=``), so the report also
counts INNOCENT dead letters: requests dead-lettered although no worker ever ran them. And it
measures recovery: for each request a killed worker held, from the SIGKILL until another
worker claimed it again (the ``started_ms`` of its final result), p50/p99/max.

``<out>/chaos.json`` holds the counts under ``report`` (``submitted``, ``completed``,
``failed``, ``dead_lettered``, ``innocent_dead_letters``, ``expired``, ``still_pending``,
``lost``, ``duplicate_results``, ``unexpected_failures``, ``executed_more_than_once``,
``kills``, ``stops``, ``redis_restarts``, ``recovery_p50_ms``/``p99``/``max``, ...) and the
run's settings under ``report.config``; the command exits 1 when a request was lost, a result
delivered twice or an innocent request dead-lettered. ``--quick`` and ``--short`` runs leave
RESULTS.md alone.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

import inferq
from benchmarks.framework import Run, Scenario, positive_int
from benchmarks.harness import Cleanup, markdown_table
from benchmarks.stack import WorkerProc, now_ms, sleep_model, spawn_worker
from inferq.embedded import EmbeddedServer
from inferq.protocol.codec import decode_result
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import DEFAULT_LEASE_MS

MODEL = "chaos"
POISON = "POISON"
KEYS = QueueKeys.for_model("embed", MODEL)


@dataclass(frozen=True)
class ChaosConfig:
    requests: int = 100_000
    workers: int = 4
    rate_per_s: float = 450.0
    kills: int = 100
    stops: int = 10
    restarts: int = 3
    #: None: the workers' default lease.
    lease_ms: int | None = None
    batch_ms: float = 15.0
    item_ms: float = 0.3
    poison_share: float = 0.01
    expiring_share: float = 0.02
    seed: int = 7
    result_timeout_s: float = 120.0

    @property
    def duration_s(self) -> float:
        return self.requests / self.rate_per_s

    @property
    def effective_lease_ms(self) -> int:
        return self.lease_ms if self.lease_ms is not None else DEFAULT_LEASE_MS


QUICK = ChaosConfig(requests=3_000, workers=3, rate_per_s=300.0, kills=5, stops=1, restarts=1,
                    result_timeout_s=60.0)
SHORT = ChaosConfig(requests=1_200, workers=2, rate_per_s=240.0, kills=3, stops=1, restarts=1,
                    result_timeout_s=30.0)


@dataclass
class Fault:
    kind: str
    at_ms: int
    worker: str | None = None
    held: list[str] = field(default_factory=list)


@dataclass
class Report:
    config: dict[str, Any]
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    #: Dead-lettered although no worker ever started to run them (must be 0).
    innocent_dead_letters: int = 0
    expired: int = 0
    still_pending: int = 0
    answered_but_not_delivered: int = 0
    lost: int = 0
    executed_more_than_once: int = 0
    max_attempts_seen: int = 0
    refused_zombie_completions: int = 0
    duplicate_results: int = 0
    unexpected_failures: int = 0
    kills: int = 0
    stops: int = 0
    redis_restarts: int = 0
    #: Per request a killed worker held: SIGKILL to its claim by another worker.
    recovery_ms: list[float] = field(default_factory=list)
    #: Per kill: SIGKILL to the last result of the requests the killed worker held.
    recovery_done_ms: list[float] = field(default_factory=list)
    throughput: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def recovery(self, q: float) -> float | None:
        if not self.recovery_ms:
            return None
        ordered = sorted(self.recovery_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["recovery_p50_ms"] = self.recovery(0.5)
        data["recovery_p99_ms"] = self.recovery(0.99)
        data["recovery_max_ms"] = max(self.recovery_ms) if self.recovery_ms else None
        return data


class Fleet:
    """Worker processes; each keeps its log in the run folder."""

    def __init__(self, cleanup: Cleanup, url: str, config: ChaosConfig, log_dir: Path) -> None:
        self.cleanup = cleanup
        self.url = url
        self.config = config
        self.log_dir = log_dir
        self.workers: dict[str, WorkerProc] = {}
        self.started = 0

    def start(self) -> str:
        self.started += 1
        worker_id = f"chaos-{self.started}"
        spec = sleep_model(MODEL, self.config.batch_ms, self.config.item_ms)
        lease = [] if self.config.lease_ms is None else ["--lease-ms", str(self.config.lease_ms)]
        self.workers[worker_id] = spawn_worker(
            self.cleanup, self.url,
            model_arg=f"{spec}&fail_on={POISON}&record={self.ran_dir}", worker_id=worker_id,
            log_dir=self.log_dir, flags=[*lease, "--max-batch-size", "32", "--max-wait-ms", "5"])
        return worker_id

    @property
    def ran_dir(self) -> Path:
        """Where the workers' models record the requests they started to run."""
        path = self.log_dir / "ran"
        path.mkdir(exist_ok=True)
        return path

    def ran(self) -> set[str]:
        """The ids of every request some worker started to run."""
        ids: set[str] = set()
        for path in self.ran_dir.glob("*.ran"):
            ids |= {line.split()[-1] for line in path.read_text().splitlines() if line}
        return ids

    def kill(self, worker_id: str) -> None:
        process = self.workers.pop(worker_id).child.process
        process.send_signal(signal.SIGKILL)
        process.wait()

    def send(self, worker_id: str, signum: int) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None:  # a stopped worker may have been killed meanwhile
            worker.child.process.send_signal(signum)


def _held_by(r: redis.Redis, worker_id: str) -> list[str]:
    """The requests a worker holds leases on right now (read before it is killed)."""
    ids = [m.decode() for m in r.zrange(KEYS.inflight, 0, -1)]
    if not ids:
        return []
    pipe = r.pipeline(transaction=False)
    for request_id in ids:
        pipe.hget(KEYS.request(request_id), "o")
    return [i for i, owner in zip(ids, pipe.execute(), strict=True)
            if owner == worker_id.encode()]


async def _inject_faults(config: ChaosConfig, fleet: Fleet, server: EmbeddedServer,
                         faults: list[Fault], done: asyncio.Event) -> None:
    """SIGKILLs, SIGSTOPs (each resumed 2.5 leases later, while the schedule goes on) and Redis
    restarts, each kind spread evenly over 90 % of the run."""
    rng = random.Random(config.seed + 1)
    r = redis.Redis.from_url(server.url)
    start = time.monotonic()
    span = config.duration_s * 0.9

    def spread(n: int, offset: float) -> list[float]:
        return [span * (i + offset) / n for i in range(n)]

    events = ([(t, "kill") for t in spread(config.kills, 0.5)]
              + [(t, "stop") for t in spread(config.stops, 0.3)]
              + [(t, "restart") for t in spread(config.restarts, 0.7)])
    resumes: list[asyncio.Task[None]] = []

    async def resume_later(victim: str) -> None:
        await asyncio.sleep(config.effective_lease_ms / 1e3 * 2.5)
        fleet.send(victim, signal.SIGCONT)

    for at, kind in sorted(events):
        delay = start + at - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(done.wait(), delay)
                break
            except TimeoutError:
                pass
        try:
            now = now_ms(r)
        except redis.RedisError:
            now = int(time.time() * 1000)
        if kind == "kill" and fleet.workers:
            victim = rng.choice(sorted(fleet.workers))
            held = _held_by(r, victim)
            fleet.kill(victim)
            faults.append(Fault("kill", now, victim, held))
            fleet.start()
        elif kind == "stop" and fleet.workers:
            victim = rng.choice(sorted(fleet.workers))
            held = _held_by(r, victim)
            fleet.send(victim, signal.SIGSTOP)
            faults.append(Fault("stop", now, victim, held))
            resumes.append(asyncio.create_task(resume_later(victim)))
        elif kind == "restart":
            r.close()
            server.stop()  # SIGTERM: the AOF is flushed; everything accepted survives
            faults.append(Fault("restart", now))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(server.start)
            r = redis.Redis.from_url(server.url)
    await asyncio.gather(*resumes)
    r.close()


async def _produce(config: ChaosConfig, url: str, results: dict[str, inferq.Result | None],
                   kinds: dict[str, str]) -> int:
    rng = random.Random(config.seed)
    submitted = 0
    async with inferq.AsyncClient(url) as client:
        waits: list[asyncio.Task[None]] = []

        async def wait(handle: inferq.AsyncHandle) -> None:
            try:
                results[handle.id] = await handle.result(timeout=config.result_timeout_s)
            except inferq.RequestError as exc:
                results[handle.id] = exc.result
            except inferq.ResultTimeout:
                results[handle.id] = None

        start = time.monotonic()
        chunk = max(1, int(config.rate_per_s / 20))  # 20 enqueue calls per second
        while submitted < config.requests:
            batch = []
            for _ in range(min(chunk, config.requests - submitted)):
                roll = rng.random()
                request_id = f"c{submitted + len(batch)}"
                if roll < config.poison_share:
                    kinds[request_id] = "poison"
                    batch.append({"prompt": f"{POISON} {request_id}", "id": request_id,
                                  "max_attempts": 2})
                elif roll < config.poison_share + config.expiring_share:
                    kinds[request_id] = "expiring"
                    batch.append({"prompt": request_id, "id": request_id, "deadline_s": 0.001,
                                  "priority": -10})
                else:
                    kinds[request_id] = "normal"
                    batch.append({"prompt": request_id, "id": request_id,
                                  "priority": rng.choice((0, 0, 0, 5))})
            while True:
                try:
                    handles = await client.enqueue_many(batch, model=MODEL)
                    break
                except (inferq.QueueFull, redis.RedisError):
                    await asyncio.sleep(0.2)  # the server restarts: the producer retries
            submitted += len(handles)
            waits += [asyncio.create_task(wait(h)) for h in handles]
            next_at = start + submitted / config.rate_per_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*waits)
    return submitted


def _phase_throughput(results: dict[str, inferq.Result | None],
                      faults: list[Fault]) -> dict[str, float]:
    finished = sorted(r.finished_ms for r in results.values()
                      if r is not None and r.finished_ms is not None)
    if not finished or not faults:
        return {}
    first, last = faults[0].at_ms, faults[-1].at_ms
    out = {}
    for name, lo, hi in (("before", finished[0], first), ("during", first, last),
                         ("after", last, finished[-1])):
        n = sum(1 for f in finished if lo <= f < hi)
        out[name] = n / max((hi - lo) / 1e3, 1e-3)
    return out


def run_chaos(config: ChaosConfig, workdir: Path) -> Report:
    """One chaos run with its own server and workers (data and logs in ``workdir``), all
    stopped when it returns."""
    report = Report(config=asdict(config))
    cleanup = Cleanup()
    # Not a BenchServer: the restart runs in a worker thread, and a server that dies with
    # its parent would die with that thread.
    server = EmbeddedServer(workdir / "redis")
    cleanup.on_close("server", server.stop)
    server.start()
    fleet = Fleet(cleanup, server.url, config, workdir)
    results: dict[str, inferq.Result | None] = {}
    kinds: dict[str, str] = {}
    faults: list[Fault] = []
    started = time.monotonic()
    try:
        for _ in range(config.workers):
            fleet.start()

        async def main() -> int:
            done = asyncio.Event()
            injector = asyncio.create_task(_inject_faults(config, fleet, server, faults, done))
            submitted = await _produce(config, server.url, results, kinds)
            done.set()
            await injector
            return submitted

        report.submitted = asyncio.run(main())
        report.wall_s = time.monotonic() - started
        r = redis.Redis.from_url(server.url)
        _tally(report, r, results, kinds, faults, fleet.ran())
        r.close()
    finally:
        cleanup.close()  # the workers (resumed if stopped), then the server
    return report


def _tally(report: Report, r: redis.Redis, results: dict[str, inferq.Result | None],
           kinds: dict[str, str], faults: list[Fault], ran_ids: set[str]) -> None:
    statuses: Counter[str] = Counter()
    for request_id, result in results.items():
        if result is None:
            continue
        statuses[result.status.value] += 1
        expected = {"normal": {"ok"}, "poison": {"dead"}, "expiring": {"expired", "ok"}}
        if result.status.value not in expected[kinds[request_id]]:
            report.unexpected_failures += 1
        if result.attempts > 1:
            report.executed_more_than_once += 1
        report.max_attempts_seen = max(report.max_attempts_seen, result.attempts)
        # The result stored now must be the one the producer received: a second write would
        # show up as a different worker or finish time.
        raw = r.lindex(KEYS.result(request_id), 0)
        stored = decode_result(raw) if raw else None
        if stored is not None and (stored.worker, stored.finished_ms) != (
                result.worker, result.finished_ms):
            report.duplicate_results += 1
    report.completed = statuses["ok"]
    report.failed = statuses["failed"]
    report.dead_lettered = statuses["dead"]
    report.expired = statuses["expired"]
    unanswered = [i for i, res in results.items() if res is None]
    queued = set()
    for key in (KEYS.pending, KEYS.inflight, KEYS.delayed):
        queued |= {m.decode() for m in r.zrange(key, 0, -1)}
    report.still_pending = sum(1 for i in unanswered if i in queued)
    stored = [i for i in unanswered if i not in queued and r.exists(KEYS.result(i))]
    report.answered_but_not_delivered = len(stored)
    report.lost = len(unanswered) - report.still_pending - len(stored)
    counters = {k.decode(): int(v) for k, v in r.hgetall(KEYS.stats).items()
                if b":" not in k}
    report.refused_zombie_completions = counters.get("refused", 0)
    written = sum(counters.get(s, 0) for s in ("ok", "failed", "dead", "expired", "cancelled"))
    report.duplicate_results += max(
        0, written - sum(statuses.values()) - report.answered_but_not_delivered)
    report.kills = sum(1 for f in faults if f.kind == "kill")
    report.stops = sum(1 for f in faults if f.kind == "stop")
    report.redis_restarts = sum(1 for f in faults if f.kind == "restart")
    ran = ran_ids
    report.innocent_dead_letters = sum(
        1 for i, res in results.items() if res is not None and res.status.value == "dead"
        and i not in ran)
    for fault in faults:
        if fault.kind != "kill":
            continue
        held = [res for i in fault.held if (res := results.get(i)) is not None]
        # Claimed again after the kill (a request the victim finished just before is not).
        again = [res.started_ms for res in held
                 if res.started_ms is not None and res.started_ms >= fault.at_ms]
        report.recovery_ms += [float(t - fault.at_ms) for t in again]
        done = [res.finished_ms for res in held if res.finished_ms is not None
                and res.started_ms is not None and res.started_ms >= fault.at_ms]
        if done:
            report.recovery_done_ms.append(float(max(done) - fault.at_ms))
    report.throughput = _phase_throughput(results, faults)


def render(report: Mapping[str, Any]) -> str:
    c = report["config"]
    rec50, rec99 = report["recovery_p50_ms"], report["recovery_p99_ms"]
    throughput = report["throughput"]
    rows = [
        ("submitted", report["submitted"]), ("completed (ok)", report["completed"]),
        ("failed", report["failed"]), ("dead-lettered (poison)", report["dead_lettered"]),
        ("innocent dead letters: dead-lettered but never ran (must be 0)",
         report["innocent_dead_letters"]),
        ("expired", report["expired"]), ("still pending at the end", report["still_pending"]),
        ("answered in Redis but not delivered to the waiting producer (must be 0)",
         report["answered_but_not_delivered"]),
        ("**LOST** (must be 0)", report["lost"]),
        ("unexpected outcomes (a normal request not ok, ...)", report["unexpected_failures"]),
        ("executed more than once (attempts > 1)", report["executed_more_than_once"]),
        ("max attempts of one request", report["max_attempts_seen"]),
        ("refused zombie completions", report["refused_zombie_completions"]),
        ("duplicate results delivered (must be 0)", report["duplicate_results"]),
        ("SIGKILLs / SIGSTOPs / Redis restarts",
         f"{report['kills']} / {report['stops']} / {report['redis_restarts']}"),
        ("recovery: SIGKILL to re-claim p50 / p99 / max (lease "
         f"{c['lease_ms'] or 'default'} ms)",
         f"{rec50:.0f} / {rec99:.0f} / {report['recovery_max_ms']:.0f} ms"
         if rec50 is not None else "-"),
        ("throughput before / during / after faults (req/s)",
         " / ".join(f"{throughput.get(k, 0):.0f}" for k in ("before", "during", "after"))),
        ("wall time", f"{report['wall_s']:.1f} s"),
    ]
    lines = [f"- Setup: {c['requests']} requests at {c['rate_per_s']:.0f}/s, {c['workers']} "
             f"worker processes (built-in sleep model {c['batch_ms']} ms/batch + "
             f"{c['item_ms']} ms/item), lease {c['lease_ms'] or 'default'} ms, "
             f"{c['poison_share']:.0%} poison "
             f"(max_attempts 2), {c['expiring_share']:.0%} with a 1 ms deadline; AOF on "
             "(appendfsync everysec); the Redis restart is a SIGTERM (AOF flushed) then a start.",
             "", markdown_table(["measure", "value"], [[name, str(v)] for name, v in rows]),
             "", "Recovery is measured per request the killed worker held: from the SIGKILL "
              "until another worker claimed it (its lease must expire and be swept first)."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ scenario


class Chaos(Scenario[ChaosConfig]):
    name = "chaos"
    title = "crashes, pauses, Redis restarts, poison, expiry"
    quick_help = "3,000 requests, 3 workers, 5 kills (~20 s); not recorded in RESULTS.md"
    config = ChaosConfig
    trials = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--short", action="store_true",
                            help="the test suite's run: 1,200 requests at 240/s, 2 workers, 3 "
                                 "kills, the default lease (~10 s); not recorded in RESULTS.md")
        parser.add_argument("--requests", type=positive_int, help="override the request count")
        parser.add_argument("--workers", type=positive_int, help="override the worker count")
        parser.add_argument("--kills", type=int, help="override the number of SIGKILLs")
        parser.add_argument("--stops", type=int, help="override the number of SIGSTOPs")
        parser.add_argument("--restarts", type=int,
                            help="override the number of Redis restarts")
        parser.add_argument("--rate", type=float, dest="rate_per_s",
                            help="override the enqueue rate (requests/s)")
        parser.add_argument("--lease-ms", type=positive_int,
                            help="the workers' --lease-ms (default: the worker's default)")

    def configure(self, args: argparse.Namespace) -> ChaosConfig:
        base = SHORT if args.short else QUICK if args.quick else ChaosConfig()
        return replace(base, **{k: v for k in ("requests", "workers", "kills", "stops",
                                                "restarts", "rate_per_s", "lease_ms")
                                if (v := getattr(args, k)) is not None})

    def records(self, args: argparse.Namespace) -> bool:
        return not (args.quick or args.short)

    def measure(self, run: Run[ChaosConfig]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="inferq-chaos-") as tmp:
            return {"report": run_chaos(run.cfg, Path(tmp)).as_dict()}

    def markdown(self, report: Mapping[str, Any]) -> str:
        return render(report["report"])

    def exit_code(self, report: Mapping[str, Any]) -> int:
        counts = report["report"]
        clean = (counts["lost"], counts["duplicate_results"], counts["innocent_dead_letters"])
        return 0 if clean == (0, 0, 0) else 1


SCENARIO = Chaos()
