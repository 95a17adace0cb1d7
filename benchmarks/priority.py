"""Scenario ``priority``: a trickle of high-priority requests through a saturating flood of
low-priority ones, against one batch time + the window; the method is in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from benchmarks import charts
from benchmarks.framework import ByMode, Run, Scenario, flag, noise_of, render
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    positive_float,
    positive_int,
    say,
    stop_child,
    verdict,
)
from benchmarks.loadgen import open_loop, poisson
from benchmarks.stack import (
    SleepWindow,
    WorkerProc,
    add_worker_arguments,
    batches_of,
    check_alive,
    load_str,
    merge_counters,
    pcts,
    queue_probe,
    read_written,
    sleep_model,
    spawn_workers,
    summarize_trials,
    window_flags,
)

if TYPE_CHECKING:
    from inferq.producer.aio import AsyncClient
    from inferq.protocol.codec import Result

TARGET_FACTOR = 2.0
TICK_S = 0.05
SAMPLE_S = 0.5
SEED = 20240607


@dataclass(frozen=True)
class PriorityConfig(SleepWindow):
    seconds: float = flag(positive_float, ByMode(60.0, 15.0), "flood duration per trial")
    workers: int = flag(positive_int, 1, "worker processes")
    overload: float = flag(positive_float, 1.5, "low-priority arrival rate / capacity")
    high_rate: float = flag(positive_float, 10.0, "high-priority Poisson arrivals per second")
    low_priority: int = flag(int, 0, "the flood's priority")
    high_priority: int = flag(int, 10, "the trickle's priority")
    warmup_s: float  # not a flag: 2 s, 1 s with --quick

    @property
    def capacity(self) -> float:
        """Requests/s the workers serve running full batches back to back."""
        return self.workers * self.worker_capacity

    @property
    def low_rate(self) -> float:
        return self.overload * self.capacity


# ------------------------------------------------------------------------------- a trial


@dataclass
class HighSample:
    at_s: float  # scheduled arrival, seconds since the flood started
    e2e_ms: float
    result: Result


@dataclass
class TrialData:
    high: list[HighSample] = field(default_factory=list)
    low_ids: list[str] = field(default_factory=list)
    oldest_low: list[tuple[float, float | None, int]] = field(default_factory=list)
    flood_s: float = 0.0


async def _flood(client: AsyncClient, model: str, cfg: PriorityConfig, t0: float,
                 data: TrialData) -> None:
    """Low-priority requests at ``cfg.low_rate``, enqueued every tick as one chunk."""
    sent = 0
    while (elapsed := time.perf_counter() - t0) < cfg.seconds:
        due = int(cfg.low_rate * elapsed) - sent
        if due > 0:
            handles = await client.enqueue_many(
                [f"low-{sent + i}" for i in range(due)], model=model,
                priority=cfg.low_priority)
            data.low_ids += [h.id for h in handles]
            sent += due
        await asyncio.sleep(TICK_S)


async def _trickle(client: AsyncClient, model: str, cfg: PriorityConfig, t0: float,
                   rng: random.Random, data: TrialData, workers: Sequence[WorkerProc]) -> None:
    """High-priority Poisson arrivals from the end of the warm-up to the end of the flood;
    each is awaited by its own task. Latency counts from the scheduled arrival."""
    async def call(i: int) -> Result:
        handle = await client.enqueue(f"high-{i}", model=model, priority=cfg.high_priority)
        return await handle.result(timeout=max(60.0, cfg.seconds * 2))

    offset = time.perf_counter() - t0
    sent = await open_loop(call, poisson(cfg.high_rate, rng, seconds=cfg.seconds,
                                         start=cfg.warmup_s), lambda: check_alive(workers))
    data.high += [HighSample(at + offset, (done - at) * 1e3, result)
                  for at, done, result in filter(None, sent.records)]


async def _sample(client: AsyncClient, model: str, cfg: PriorityConfig, t0: float,
                  data: TrialData, stop: asyncio.Event) -> None:
    """Every SAMPLE_S: the age of the oldest waiting low-priority request, and their count."""
    from inferq.protocol import scores
    from inferq.protocol.keys import QueueKeys

    keys = QueueKeys.for_model("embed", model)
    low, high = scores.band(cfg.low_priority), scores.band(cfg.low_priority) + scores.SEQ_LIMIT
    r = client.redis
    while not stop.is_set():
        first = await r.zrangebyscore(keys.pending, low, f"({high}", start=0, num=1)
        count = int(await r.zcount(keys.pending, low, f"({high}"))
        age = None
        if first:
            request_id = first[0].decode() if isinstance(first[0], bytes) else str(first[0])
            eq = await r.hget(keys.request(request_id), "eq")
            seconds, micros = await r.time()
            if eq is not None:
                age = int(seconds) * 1000 + int(micros) // 1000 - int(eq)
        data.oldest_low.append((time.perf_counter() - t0, age, count))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


def run_trial(cleanup: Cleanup, url: str, cfg: PriorityConfig, trial: int,
              server: int | None, log_dir: Path) -> dict[str, Any]:
    from inferq.producer.aio import AsyncClient
    from inferq.protocol.keys import QueueKeys

    model = f"prio-t{trial}"
    ids = [f"bench-prio-t{trial}-{i}" for i in range(cfg.workers)]
    workers = spawn_workers(cleanup, url, ids, log_dir=log_dir,
                            model_arg=sleep_model(model, cfg.batch_ms, cfg.item_ms),
                            flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
    data = TrialData()
    rng = random.Random(SEED + trial)
    probe = queue_probe(server, [w.pid for w in workers])

    async def main() -> None:
        async with AsyncClient(url) as flood_client, AsyncClient(url) as high_client:
            stop = asyncio.Event()
            t0 = time.perf_counter()
            sampler = asyncio.create_task(_sample(flood_client, model, cfg, t0, data, stop))
            flood = asyncio.create_task(_flood(flood_client, model, cfg, t0, data))
            await _trickle(high_client, model, cfg, t0, rng, data, workers)
            await flood
            data.flood_s = time.perf_counter() - t0
            stop.set()
            await sampler

    probe.start()
    asyncio.run(main())
    cpu = probe.stop()
    check_alive(workers)

    client = redis.Redis.from_url(url)
    keys = QueueKeys.for_model("embed", model)
    served_low = read_written(client, keys, data.low_ids)  # the rest are still queued
    for w in workers:
        stop_child(w.child)
    client.flushdb()  # the backlog of this trial
    client.close()
    return summarize_trial(cfg, data, served_low, cpu)


def summarize_trial(cfg: PriorityConfig, data: TrialData, served_low: Sequence[Result],
                    cpu: Mapping[str, float | None]) -> dict[str, Any]:
    high = sorted(data.high, key=lambda s: s.at_s)
    bad = [s for s in high if s.result.status.value != "ok"]
    if bad or not high:
        raise BenchmarkFailed(f"high priority: {len(bad)} failed of {len(high)}: {bad[:1]!r}")
    e2e = [s.e2e_ms for s in high]
    redis_ms = [s.result.total_ms for s in high if s.result.total_ms is not None]
    wait_ms = [s.result.queue_wait_ms for s in high if s.result.queue_wait_ms is not None]
    everything = [*(s.result for s in high), *served_low]
    sizes = batches_of(everything)
    full = [r.compute_ms for r in everything
            if r.compute_ms is not None and r.batch_size == cfg.max_batch_size]
    batch_ms = statistics.median(full) if full else cfg.full_batch_ms
    reference = batch_ms + cfg.max_wait_ms
    low_total = [r.total_ms for r in served_low if r.total_ms is not None]
    ages = [a for _, a, _ in data.oldest_low if a is not None]
    served_rate = len(served_low) / max(data.flood_s, 1e-9)
    out: dict[str, Any] = {
        "high_e2e_ms": pcts(e2e), "high_redis_ms": pcts(redis_ms),
        "high_queue_wait_ms": pcts(wait_ms), "high_count": len(high),
        "high_batch_size_mean": statistics.fmean(s.result.batch_size or 0 for s in high),
        "batch_ms": batch_ms, "reference_ms": reference,
        "high_p99_over_reference": (pcts(e2e)["p99"] or 0.0) / reference,
        "high_redis_p99_over_reference": (pcts(redis_ms)["p99"] or 0.0) / reference,
        "low_served": len(served_low), "low_enqueued": len(data.low_ids),
        "low_served_per_s": served_rate, "low_completed_total_ms": pcts(low_total),
        "low_oldest_wait_ms_max": max(ages) if ages else None,
        "low_oldest_wait_ms_end": ages[-1] if ages else None,
        "low_pending_end": data.oldest_low[-1][2] if data.oldest_low else None,
        "oldest_low_series": data.oldest_low,
        "high_series": [(s.at_s, s.e2e_ms) for s in high],
        "batch_sizes": dict(sorted(sizes.items())),
        "flood_s": data.flood_s, "cpu_seconds": dict(cpu), "other_load": cpu.get("other_load"),
    }
    say(f"  high priority: {len(high)} requests, e2e p50/p99 "
        f"{out['high_e2e_ms']['p50']:.0f}/{out['high_e2e_ms']['p99']:.0f} ms (Redis clock "
        f"{out['high_redis_ms']['p50']:.0f}/{out['high_redis_ms']['p99']:.0f}) vs batch "
        f"{batch_ms:.0f} ms + window {cfg.max_wait_ms:g} ms = {reference:.0f} ms -> p99 is "
        f"{out['high_p99_over_reference']:.2f}x; low priority served {served_rate:.0f}/s, "
        f"oldest waiting {(out['low_oldest_wait_ms_end'] or 0) / 1e3:.1f} s at the end; other "
        f"load {load_str(out['other_load'])}")
    return out


# ------------------------------------------------------------------------------ reports


def figures(trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    s: dict[str, Any] = {}
    for key in ("high_e2e_ms", "high_redis_ms", "high_queue_wait_ms",
                "low_completed_total_ms"):
        s[key] = {q: summarize_trials(trials, [key, q]) for q in ("p50", "p90", "p99", "max")}
    for key in ("batch_ms", "reference_ms", "high_p99_over_reference",
                "high_redis_p99_over_reference", "low_served_per_s", "low_oldest_wait_ms_max",
                "low_oldest_wait_ms_end", "low_pending_end", "high_count",
                "high_batch_size_mean", "other_load"):
        s[key] = summarize_trials(trials, [key])
    s["batch_sizes"] = merge_counters(t["batch_sizes"] for t in trials)
    report["summary"] = s
    report["trials"] = list(trials)
    report["noise"] = noise_of(t.get("other_load") for t in trials)
    ratio = s["high_p99_over_reference"]["median"]
    report["target"] = {"factor": TARGET_FACTOR, "p99_over_reference": ratio,
                        "verdict": verdict(ratio, TARGET_FACTOR, at_most=True)}
    return report


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    s, trials = r["summary"], r["trials"]
    ref = s["reference_ms"]["median"] or 0.0
    qs = ("p50", "p90", "p99")
    groups = ["high, end to end", "high, Redis clock", "low (served), Redis clock"]
    keys = ("high_e2e_ms", "high_redis_ms", "low_completed_total_ms")
    p1 = charts.trial_bars(
        folder / "priority-latency.png", title="Latency by priority under a low-priority flood",
        ylabel="ms (log scale)", groups=groups,
        values={q: [s[k][q]["trials"] for k in keys] for q in qs},
        hlines=[(f"one batch + window = {ref:.0f} ms", ref),
                (f"target: p99 <= {TARGET_FACTOR:g}x = {ref * TARGET_FACTOR:.0f} ms",
                 ref * TARGET_FACTOR)],
        logy=True, note="median over trials, bars = min..max; low priority: only requests "
                        "served during the flood (the backlog still waits)")
    t = trials[0]
    high_series = charts.Series("high priority: each request's latency (end to end)",
                                [x for x, _ in t["high_series"]],
                                [y for _, y in t["high_series"]], style=".")
    oldest = charts.Series("low priority: age of the oldest waiting request",
                           [x for x, _, _ in t["oldest_low_series"]],
                           [y for _, y, _ in t["oldest_low_series"]], style="-")
    p2 = charts.line_chart(
        folder / "priority-timeline.png", title="During the flood (first trial)",
        xlabel="seconds since the flood started", ylabel="ms (log scale)",
        series=[high_series, oldest],
        hlines=[(f"target for high-priority p99: {ref * TARGET_FACTOR:.0f} ms",
                 ref * TARGET_FACTOR)], logy=True)
    return [p1, p2]


def results_markdown(r: Mapping[str, Any]) -> str:
    return render("priority", r, ref=r["summary"]["reference_ms"]["median"] or 0.0)


class Priority(Scenario[PriorityConfig]):
    name = "priority"
    title = "high-priority requests through a low-priority flood"
    quick_help = "one 15 s flood (~30 s)"
    config = PriorityConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_worker_arguments(parser, max_batch_size=32, max_wait_ms=10.0, batch_ms=40.0,
                             item_ms=0.5)
        parser.set_defaults(warmup_s=ByMode(2.0, 1.0))

    def configure(self, args: argparse.Namespace) -> PriorityConfig:
        cfg = super().configure(args)
        if cfg.full_batch_ms <= 0:
            raise SystemExit(f"benchmarks {self.name}: --batch-ms + --item-ms must be > 0")
        if cfg.seconds <= cfg.warmup_s + 1:
            raise SystemExit(f"benchmarks {self.name}: --seconds must exceed "
                             f"{cfg.warmup_s + 1:g}")
        if cfg.high_priority <= cfg.low_priority:
            raise SystemExit(f"benchmarks {self.name}: --high-priority must exceed "
                             "--low-priority")
        return cfg

    def measure(self, run: Run[PriorityConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        say(f"{self.name} benchmark: {cfg.workers} worker(s), full batch "
            f"{cfg.full_batch_ms:.0f} ms -> capacity {cfg.capacity:.0f} req/s; low priority at "
            f"{cfg.low_rate:.0f}/s ({cfg.overload:g}x), high priority {cfg.high_rate:g}/s; "
            f"{cfg.seconds:g} s x {run.trials} trial(s)")
        trials = [run_trial(run.cleanup, url, cfg, trial, server.pid, run.log_dir)
                  for trial in run.each_trial()]
        server.stop()
        return figures(trials)


SCENARIO = Priority()
