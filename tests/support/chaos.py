"""The chaos harness: real ``inferq worker`` processes against a real server with AOF while
faults are injected on a schedule, then a tally of every request's outcome.

Faults, each kind spread evenly over 90 % of the run: SIGKILLs of a random worker (a new one
starts in its place), SIGSTOPs of a worker for 2.5 leases (then SIGCONT), restarts of the
server (SIGTERM: the AOF is flushed; then a start), plus poison requests (the model raises on
them), crash poisons (the model SIGKILLs its own worker on them; a supervisor starts a new
worker in its place) and requests whose deadline passes in the queue. The workers' model
(``tests.support.crashing_model``, a sleep) records every request it starts (``record=``), so
the tally counts innocent dead letters (dead-lettered but never run) and innocent crash dead
letters (``crashed_worker`` for a request that is not a crash poison). ``lost``: accepted by
enqueue but neither answered nor still queued; it must be 0.

``tests/e2e/test_chaos.py`` runs ``SHORT``; ``python -m benchmarks chaos`` runs the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

import inferq
from inferq.embedded import EmbeddedServer
from inferq.protocol.codec import decode_result
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import DEFAULT_LEASE_MS
from tests.support.processes import WorkerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
MODEL = "chaos"
POISON = "POISON"
CRASH = "CRASH"
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
    #: Requests that crash the worker that runs them (spread evenly over the run).
    crash_poisons: int = 1
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
#: Its result timeout leaves room for the crash poison's paced isolation while replacements start
#: (on a loaded machine a start took 7 to 9 s; with 2 workers each poison death waits for one).
SHORT = ChaosConfig(requests=1_200, workers=2, rate_per_s=240.0, kills=3, stops=1, restarts=1,
                    result_timeout_s=90.0)


@dataclass
class Fault:
    kind: str
    at_ms: int
    worker: str | None = None
    held: list[str] = field(default_factory=list)
    #: A restart: when the server answered again (ms, this machine's clock).
    until_ms: int = 0


@dataclass
class Report:
    config: dict[str, Any]
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    #: Dead-lettered although no worker ever started to run them (must be 0).
    innocent_dead_letters: int = 0
    #: Dead-lettered ``crashed_worker`` although not a crash poison (must be 0).
    innocent_crash_dead_letters: int = 0
    #: Crash poisons dead-lettered ``crashed_worker``, and the workers they killed.
    crash_poisons_dead_lettered: int = 0
    crash_deaths: int = 0
    #: Runs lost with their worker, over every result (``Result.lost_runs``).
    lost_runs: int = 0
    expired: int = 0
    still_pending: int = 0
    #: Answered in Redis before the producer stopped waiting, yet never handed to it (a
    #: delivery failure; must be 0).
    answered_but_not_delivered: int = 0
    #: Answered in Redis only after the producer's wait (``result_timeout_s``) had ended: the
    #: queue was slower than the producer's patience, nothing failed to arrive.
    answered_after_the_wait: int = 0
    #: ``answered_after_the_wait`` by kind of request (normal, expiring, poison, crash).
    answered_after_the_wait_by_kind: dict[str, int] = field(default_factory=dict)
    #: Per request the producer did not receive (up to 50): id, kind, status, when the wait
    #: ended and when the result was written (ms after enqueue).
    undelivered: list[dict[str, Any]] = field(default_factory=list)
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
    #: ``recovery_ms`` of the kills away from a Redis restart (none began in the 5 s after
    #: the kill, none ended in the 2 s before it): what the restarts' downtime does not hide.
    recovery_calm_ms: list[float] = field(default_factory=list)
    #: Per restart: SIGTERM to the restarted server's first answer.
    restart_down_ms: list[float] = field(default_factory=list)
    #: Per request a killed worker held: SIGKILL to the first start of a run of it after the
    #: kill (the model's records), whatever became of that run (``recovery_ms`` counts to the
    #: claim of the run that answered, which may come after more losses).
    rerun_ms: list[float] = field(default_factory=list)
    #: ``rerun_ms``, but where a Redis restart's downtime overlaps the wait, from the moment
    #: the restarted server answered (what the queue can do once it has a server).
    rerun_from_redis_ms: list[float] = field(default_factory=list)
    #: Kills when no other worker was serving (the others killed, stopped or still starting):
    #: their requests wait for a new worker to start.
    kills_with_no_other_worker: int = 0
    #: ``rerun_ms`` of the kills while another worker served (what the queue's recovery does
    #: when it has a worker), and of the others (a worker had to start first).
    rerun_served_ms: list[float] = field(default_factory=list)
    rerun_unserved_ms: list[float] = field(default_factory=list)
    #: Workers that exited on their own but not by a crash poison's SIGKILL (at start, while
    #: the server restarted: ``cannot connect``); a supervisor started others.
    start_failures: int = 0
    #: Per kill: when (ms from the first fault), the victim, what it held, the slowest held
    #: request's first rerun and final claim, and that request's runs after the kill.
    kill_timeline: list[dict[str, Any]] = field(default_factory=list)
    #: Every fleet event, ``[ms from the first fault, kind, worker]``: start, registered,
    #: kill, crash-death, stop, cont, restart, restarted.
    timeline: list[list[Any]] = field(default_factory=list)
    throughput: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def recovery(self, q: float, calm: bool = False) -> float | None:
        samples = self.recovery_calm_ms if calm else self.recovery_ms
        if not samples:
            return None
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["recovery_p50_ms"] = self.recovery(0.5)
        data["recovery_p99_ms"] = self.recovery(0.99)
        data["recovery_max_ms"] = max(self.recovery_ms) if self.recovery_ms else None
        data["recovery_calm_p50_ms"] = self.recovery(0.5, calm=True)
        data["recovery_calm_p99_ms"] = self.recovery(0.99, calm=True)
        data["recovery_calm_max_ms"] = (max(self.recovery_calm_ms) if self.recovery_calm_ms
                                        else None)
        for what, samples in (("rerun", self.rerun_ms),
                              ("rerun_from_redis", self.rerun_from_redis_ms),
                              ("rerun_served", self.rerun_served_ms),
                              ("rerun_unserved", self.rerun_unserved_ms)):
            ordered = sorted(samples)
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                data[f"{what}_{name}_ms"] = (
                    ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None)
            data[f"{what}_max_ms"] = ordered[-1] if ordered else None
            data[f"{what}_within_1s"] = sum(1 for x in samples if x <= 1000)
            data[f"{what}_samples"] = len(samples)
        return data


class Fleet:
    """The worker processes (logs and the requests their models ran in ``folder``)."""

    def __init__(self, url: str, config: ChaosConfig, folder: Path) -> None:
        self.url, self.config, self.folder = url, config, folder
        self.workers: dict[str, WorkerProcess] = {}
        self.started = 0
        self.ran_dir = folder / "ran"
        self.ran_dir.mkdir(parents=True, exist_ok=True)
        #: ``[wall-clock ms, kind, worker]`` per event (see ``Report.timeline``).
        self.events: list[list[Any]] = []
        self._unregistered: set[str] = set()

    def note(self, kind: str, worker: str = "") -> None:
        self.events.append([int(time.time() * 1e3), kind, worker])

    def start(self) -> str:
        self.started += 1
        worker_id = f"chaos-{self.started}"
        self.note("start", worker_id)
        self._unregistered.add(worker_id)
        c = self.config
        lease = [] if c.lease_ms is None else ["--lease-ms", str(c.lease_ms)]
        self.workers[worker_id] = WorkerProcess(
            self.url, "--log-level", "WARNING", "--model",
            f"{MODEL}=python:tests.support.crashing_model:CrashingModel?marker={CRASH}"
            f"&batch_ms={c.batch_ms:g}&item_ms={c.item_ms:g}&fail_on={POISON}"
            f"&record={self.ran_dir}", "--worker-id", worker_id, *lease, "--device", "cpu",
            "--max-batch-size", "32", "--max-wait-ms", "5", log_dir=self.folder,
            env={"PYTHONPATH": os.pathsep.join(filter(None, (
                str(ROOT), os.environ.get("PYTHONPATH"))))})
        return worker_id

    def replace_dead(self) -> tuple[int, int]:
        """Start a worker in place of each that died on its own; how many a crash poison
        killed (SIGKILL) and how many exited otherwise (at start, the server down)."""
        dead = [w for w, p in self.workers.items() if p.proc.poll() is not None]
        killed = 0
        for worker_id in dead:
            poisoned = self.workers[worker_id].proc.returncode == -signal.SIGKILL
            killed += poisoned
            self.note("crash-death" if poisoned else "exited", worker_id)
            self.workers.pop(worker_id).stop()
            self.start()
        return killed, len(dead) - killed

    def note_registered(self, r: redis.Redis) -> None:
        """Note the workers that joined the queue's worker set since the last call."""
        waiting = sorted(self._unregistered)
        if not waiting:
            return
        pipe = r.pipeline(transaction=False)
        for worker_id in waiting:
            pipe.zscore(KEYS.workers, worker_id)
        for worker_id, score in zip(waiting, pipe.execute(), strict=True):
            if score is not None:
                self._unregistered.discard(worker_id)
                self.note("registered", worker_id)

    def wait_registered(self, timeout_s: float = 60.0) -> None:
        """Until every worker has joined the queue's worker set (its model loaded)."""
        with redis.Redis.from_url(self.url) as r:
            wait_until(lambda: all(r.zscore(KEYS.workers, w) is not None
                                   for w in self.workers), timeout_s, "the chaos workers")

    def ran(self) -> set[str]:
        """The ids of every request some worker started to run."""
        ids: set[str] = set()
        for path in self.ran_dir.glob("*.ran"):
            ids |= {line.split()[-1] for line in path.read_text().splitlines() if line}
        return ids

    def starts(self) -> dict[str, list[tuple[int, int]]]:
        """Per request id, every start of a run of it: (wall-clock ms, batch size), in order."""
        runs: dict[str, list[tuple[int, int]]] = {}
        for path in self.ran_dir.glob("*.starts"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3:
                    runs.setdefault(parts[-1], []).append((int(parts[0]), int(parts[1])))
        for seen in runs.values():
            seen.sort()
        return runs

    def kill(self, worker_id: str) -> None:
        worker = self.workers.pop(worker_id)
        worker.proc.send_signal(signal.SIGKILL)
        self.note("kill", worker_id)
        worker.stop()

    def send(self, worker_id: str, signum: int) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None and worker.proc.poll() is None:  # it may have been killed
            worker.proc.send_signal(signum)
            self.note({signal.SIGSTOP: "stop", signal.SIGCONT: "cont"}.get(signum, "signal"),
                      worker_id)

    def stop(self) -> None:
        for worker_id in list(self.workers):
            self.send(worker_id, signal.SIGCONT)  # a stopped worker ignores SIGTERM
            self.workers.pop(worker_id).stop(timeout=20)


def _held_by(r: redis.Redis, worker_id: str) -> list[str]:
    """The requests a worker holds leases on right now (read before it is killed)."""
    ids = [m.decode() for m in r.zrange(KEYS.inflight, 0, -1)]
    pipe = r.pipeline(transaction=False)
    for request_id in ids:
        pipe.hget(KEYS.request(request_id), "o")
    owners = pipe.execute() if ids else []
    return [i for i, owner in zip(ids, owners, strict=True) if owner == worker_id.encode()]


def _now_ms(r: redis.Redis) -> int:
    try:
        seconds, micros = r.time()
        return int(seconds) * 1000 + int(micros) // 1000
    except redis.RedisError:
        return int(time.time() * 1000)


async def _inject_faults(config: ChaosConfig, fleet: Fleet, server: EmbeddedServer,
                         faults: list[Fault], report: Report, done: asyncio.Event) -> None:
    """SIGKILLs, SIGSTOPs (each resumed 2.5 leases later, while the schedule goes on) and
    server restarts, each kind spread evenly over 90 % of the run."""
    rng = random.Random(config.seed + 1)
    r = redis.Redis.from_url(server.url)
    start, span = time.monotonic(), config.duration_s * 0.9
    events = sorted([(span * (i + offset) / n, kind) for kind, n, offset in (
        ("kill", config.kills, 0.5), ("stop", config.stops, 0.3),
        ("restart", config.restarts, 0.7)) for i in range(n)])
    resumes: list[asyncio.Task[None]] = []

    async def resume_later(victim: str) -> None:
        await asyncio.sleep(config.effective_lease_ms / 1e3 * 2.5)
        fleet.send(victim, signal.SIGCONT)

    for at, kind in events:
        delay = start + at - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(done.wait(), delay)
                break
            except TimeoutError:
                pass
        now = _now_ms(r)
        if kind in ("kill", "stop") and fleet.workers:
            victim = rng.choice(sorted(fleet.workers))
            faults.append(Fault(kind, now, victim, _held_by(r, victim)))
            if kind == "kill":
                fleet.kill(victim)
                fleet.start()
            else:
                fleet.send(victim, signal.SIGSTOP)
                resumes.append(asyncio.create_task(resume_later(victim)))
        elif kind == "restart":
            r.close()
            fleet.note("restart")
            server.stop()  # SIGTERM: the AOF is flushed; everything accepted survives
            restart = Fault("restart", now)
            faults.append(restart)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(server.start)
            r = redis.Redis.from_url(server.url)
            restart.until_ms = _now_ms(r)
            fleet.note("restarted")
            report.restart_down_ms.append(float(restart.until_ms - restart.at_ms))
    await asyncio.gather(*resumes)
    r.close()


async def _supervise(fleet: Fleet, report: Report, done: asyncio.Event) -> None:
    """Start a worker in place of each that a crash poison killed, and note when new workers
    join the queue, until the run ends."""
    with redis.Redis.from_url(fleet.url, socket_timeout=1, socket_connect_timeout=1) as r:
        while not done.is_set():
            killed, exited = fleet.replace_dead()
            report.crash_deaths += killed
            report.start_failures += exited
            with contextlib.suppress(redis.RedisError):
                fleet.note_registered(r)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)


async def _produce(config: ChaosConfig, url: str, results: dict[str, inferq.Result | None],
                   kinds: dict[str, str], gave_up: dict[str, int]) -> int:
    """Enqueue at ``config.rate_per_s`` (20 ``enqueue_many`` calls a second, retried while
    the server restarts) and await every result (``gave_up``: when each wait that timed out
    ended, wall-clock ms)."""
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
                gave_up[handle.id] = int(time.time() * 1e3)

        start = time.monotonic()
        chunk = max(1, int(config.rate_per_s / 20))
        crash_at = {config.requests * (k + 1) // (config.crash_poisons + 1)
                    for k in range(config.crash_poisons)}
        while submitted < config.requests:
            batch = []
            for _ in range(min(chunk, config.requests - submitted)):
                roll = rng.random()
                request_id = f"c{submitted + len(batch)}"
                if submitted + len(batch) in crash_at:
                    kinds[request_id] = "crash"
                    batch.append({"prompt": f"{CRASH} {request_id}", "id": request_id})
                elif roll < config.poison_share:
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
            await asyncio.sleep(max(0.0, start + submitted / config.rate_per_s
                                    - time.monotonic()))
        await asyncio.gather(*waits)
    return submitted


def run_chaos(config: ChaosConfig, workdir: Path) -> Report:
    """One chaos run with its own server and workers (data and logs in ``workdir``), all
    stopped when it returns."""
    report = Report(config=asdict(config))
    server = EmbeddedServer(workdir / "redis")
    server.start()
    fleet = Fleet(server.url, config, workdir)
    results: dict[str, inferq.Result | None] = {}
    kinds: dict[str, str] = {}
    gave_up: dict[str, int] = {}
    faults: list[Fault] = []
    try:
        for _ in range(config.workers):
            fleet.start()
        fleet.wait_registered()
        started = time.monotonic()

        async def main() -> int:
            done = asyncio.Event()
            injector = asyncio.create_task(_inject_faults(config, fleet, server, faults, report,
                                                          done))
            supervisor = asyncio.create_task(_supervise(fleet, report, done))
            submitted = await _produce(config, server.url, results, kinds, gave_up)
            done.set()
            await asyncio.gather(injector, supervisor)
            return submitted

        report.submitted = asyncio.run(main())
        report.wall_s = time.monotonic() - started
        with redis.Redis.from_url(server.url) as r:
            _tally(report, r, results, kinds, gave_up, faults, fleet.ran())
        _timeline(report, results, faults, fleet)
    finally:
        fleet.stop()  # the workers (resumed if stopped), then the server
        server.stop()
    return report


def _tally(report: Report, r: redis.Redis, results: dict[str, inferq.Result | None],
           kinds: dict[str, str], gave_up: dict[str, int], faults: list[Fault],
           ran: set[str]) -> None:
    expected = {"normal": {"ok"}, "poison": {"dead"}, "expiring": {"expired", "ok"},
                "crash": {"dead"}}
    statuses: Counter[str] = Counter()
    for request_id, result in results.items():
        if result is None:
            continue
        statuses[result.status.value] += 1
        report.unexpected_failures += result.status.value not in expected[kinds[request_id]]
        lost_runs = getattr(result, "lost_runs", None) or 0
        report.lost_runs += lost_runs
        report.executed_more_than_once += result.attempts > 1 or lost_runs > 0
        report.max_attempts_seen = max(report.max_attempts_seen, result.attempts)
        if result.error is not None and result.error.code == "crashed_worker":
            if kinds[request_id] == "crash":
                report.crash_poisons_dead_lettered += 1
            else:
                report.innocent_crash_dead_letters += 1
        # The result stored now must be the one the producer received: a second write would
        # show up as a different worker or finish time.
        raw = r.lindex(KEYS.result(request_id), 0)
        stored = decode_result(raw) if raw else None
        if stored is not None and (stored.worker, stored.finished_ms) != (
                result.worker, result.finished_ms):
            report.duplicate_results += 1
    report.completed, report.failed = statuses["ok"], statuses["failed"]
    report.dead_lettered, report.expired = statuses["dead"], statuses["expired"]
    unanswered = [i for i, res in results.items() if res is None]
    queued = {m.decode() for key in (KEYS.pending, KEYS.inflight, KEYS.delayed)
              for m in r.zrange(key, 0, -1)}
    report.still_pending = sum(1 for i in unanswered if i in queued)
    answered = 0
    for request_id in (i for i in unanswered if i not in queued):
        raw = r.lindex(KEYS.result(request_id), 0)
        if raw is None:
            continue
        answered += 1
        _undelivered(report, decode_result(raw), kinds[request_id], gave_up.get(request_id))
    report.lost = len(unanswered) - report.still_pending - answered
    counters = {k.decode(): int(v) for k, v in r.hgetall(KEYS.stats).items() if b":" not in k}
    report.refused_zombie_completions = counters.get("refused", 0)
    written = sum(counters.get(s, 0) for s in ("ok", "failed", "dead", "expired", "cancelled"))
    report.duplicate_results += max(0, written - sum(statuses.values()) - answered)
    kinds_seen = Counter(f.kind for f in faults)
    report.kills, report.stops = kinds_seen["kill"], kinds_seen["stop"]
    report.redis_restarts = kinds_seen["restart"]
    report.innocent_dead_letters = sum(
        1 for i, res in results.items()
        if res is not None and res.status.value == "dead" and i not in ran)
    for fault in (f for f in faults if f.kind == "kill"):
        # Claimed again after the kill (a request the victim finished just before is not).
        again = [res for i in fault.held if (res := results.get(i)) is not None
                 and res.started_ms is not None and res.started_ms >= fault.at_ms]
        samples = [float(res.started_ms - fault.at_ms) for res in again
                   if res.started_ms is not None]
        report.recovery_ms += samples
        if not any(f.kind == "restart" and (0 <= f.at_ms - fault.at_ms < 5000
                                            or 0 <= fault.at_ms - f.until_ms < 2000)
                   for f in faults):
            report.recovery_calm_ms += samples
        done = [res.finished_ms for res in again if res.finished_ms is not None]
        if done:
            report.recovery_done_ms.append(float(max(done) - fault.at_ms))
    report.throughput = _phase_throughput(results, faults)


def _undelivered(report: Report, result: inferq.Result, kind: str, gave_up_ms: int | None
                 ) -> None:
    """Count a result in Redis that the producer did not receive: written after its wait
    ended (late), or before (a delivery failure)."""
    late = (gave_up_ms is not None and result.finished_ms is not None
            and result.finished_ms > gave_up_ms)
    if late:
        report.answered_after_the_wait += 1
        by_kind = report.answered_after_the_wait_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
    else:
        report.answered_but_not_delivered += 1
    if len(report.undelivered) < 50:
        since = result.enqueued_ms
        report.undelivered.append({
            "id": result.id, "kind": kind, "status": result.status.value, "late": late,
            "wait_ended_ms": None if gave_up_ms is None or since is None
            else gave_up_ms - since,
            "written_ms": None if result.finished_ms is None or since is None
            else result.finished_ms - since,
            "attempts": result.attempts})


def _phase_throughput(results: dict[str, inferq.Result | None],
                      faults: list[Fault]) -> dict[str, float]:
    """Results finished per second before the first fault, during the faults, after the last."""
    finished = sorted(r.finished_ms for r in results.values()
                      if r is not None and r.finished_ms is not None)
    if not finished or not faults:
        return {}
    first, last = faults[0].at_ms, faults[-1].at_ms
    return {name: sum(1 for f in finished if lo <= f < hi) / max((hi - lo) / 1e3, 1e-3)
            for name, lo, hi in (("before", finished[0], first), ("during", first, last),
                                 ("after", last, finished[-1]))}


def _timeline(report: Report, results: dict[str, inferq.Result | None], faults: list[Fault],
              fleet: Fleet) -> None:
    """The per-kill timeline and the fleet's events (``Report.kill_timeline``, ``timeline``),
    in ms from the first fault."""
    if not faults:
        return
    origin = faults[0].at_ms
    starts = fleet.starts()
    restarts = [f for f in faults if f.kind == "restart"]
    report.timeline = [[ms - origin, kind, worker] for ms, kind, worker in fleet.events]
    serving: set[str] = set()
    gone: set[str] = set()
    events = iter(sorted(fleet.events))
    upcoming = next(events, None)
    for fault in (f for f in faults if f.kind == "kill"):
        while upcoming is not None and upcoming[0] < fault.at_ms:
            _, kind, worker = upcoming
            if kind in ("registered", "cont") and worker not in gone:
                serving.add(worker)
            elif kind in ("kill", "crash-death", "exited", "stop"):
                serving.discard(worker)
                if kind != "stop":
                    gone.add(worker)
            upcoming = next(events, None)
        others = len(serving - {fault.worker or ""})
        report.kills_with_no_other_worker += others == 0
        slowest: tuple[float, str] | None = None
        finals: list[float] = []
        for request_id in fault.held:
            after = [(ms, size) for ms, size in starts.get(request_id, []) if ms >= fault.at_ms]
            if not after:
                continue  # it finished before the kill
            rerun = float(after[0][0] - fault.at_ms)
            report.rerun_ms.append(rerun)
            (report.rerun_served_ms if others else report.rerun_unserved_ms).append(rerun)
            back = max([fault.at_ms, *(f.until_ms for f in restarts
                                       if f.at_ms <= after[0][0] and f.until_ms >= fault.at_ms)])
            report.rerun_from_redis_ms.append(float(after[0][0] - back))
            if slowest is None or rerun > slowest[0]:
                slowest = (rerun, request_id)
            res = results.get(request_id)
            if res is not None and res.started_ms is not None:
                finals.append(float(res.started_ms - fault.at_ms))
        restart = min(restarts, key=lambda f: abs(f.at_ms - fault.at_ms), default=None)
        report.kill_timeline.append({
            "at_ms": fault.at_ms - origin, "worker": fault.worker, "held": len(fault.held),
            "other_workers_serving": others,
            "rerun_max_ms": slowest[0] if slowest else None,
            "final_claim_max_ms": max(finals) if finals else None,
            "nearest_restart_ms": None if restart is None else restart.at_ms - fault.at_ms,
            "slowest": None if slowest is None else {
                "id": slowest[1], "runs_after_kill": [
                    [ms - fault.at_ms, size] for ms, size in starts.get(slowest[1], [])
                    if ms >= fault.at_ms]}})
