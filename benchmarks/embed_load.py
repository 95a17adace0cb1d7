"""Scenario ``embed-load``: MiniLM embeddings (the stack of ``embed``) under open-loop Poisson
arrivals at several offered loads, as fractions of the full stack's measured capacity; the
method is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import charts, corpus
from benchmarks.embed import MAX_WORDS, MIN_WORDS, start_workers
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    flag,
    float_list,
    int_list,
    noise_of,
    render,
    render_rows,
    switch,
)
from benchmarks.harness import BenchmarkFailed, CpuProbe, positive_float, positive_int, say, summary
from benchmarks.loadgen import open_loop, poisson
from benchmarks.models import BareModel, minilm_path
from benchmarks.stack import (
    WorkerProc,
    batches_of,
    check_ok,
    closed_loop,
    load_str,
    merge_counters,
    pcts,
    stop_all,
    summarize_fields,
    warm_up,
    watchdog,
)

CORPUS_SEED = 20240611
WARMUP_SEED = 11
ARRIVAL_SEED = 4242


@dataclass(frozen=True)
class LoadConfig:
    loads: tuple[float, ...] = flag(float_list, "0.25,0.5,0.75,1.0,1.25", "offered loads as "
                                    "fractions of the full stack's capacity")
    seconds: float = flag(positive_float, ByMode(30.0, 5.0), "arrival period per load")
    capacity_requests: int = flag(positive_int, ByMode(1000, 200), "requests in the "
                                  "closed-loop capacity burst, at least 8; the batch-1 worker "
                                  "gets a quarter")
    capacity: float | None = flag(positive_float, None, "use this full-stack capacity (req/s) "
                                  "instead of measuring it")
    capacity_passes: int = flag(positive_int, ByMode(3, 1), "closed-loop bursts for the "
                                "capacity; the median is used")
    bs1: bool = switch("leave out the batch-1 worker", name="--no-bs1")
    bs1_max_overload: float = flag(positive_float, ByMode(1.5, 1.0), "run the batch-1 worker "
                                   "at a load only when the offered rate is at most this "
                                   "multiple of its own capacity")
    limit: bool = switch("do not load the bare model in this process for the limit line",
                         name="--no-limit")
    limit_batch_sizes: tuple[int, ...] = flag(int_list, "8,16,32", "bare-model batch sizes "
                                              "tried for the limit, the best counts")
    warmup: int = flag(positive_int, ByMode(256, 64), "warm-up requests for the full worker, "
                       "a quarter for the batch-1 worker")
    ready_timeout_s: float = 300.0

    @property
    def timeout_s(self) -> float:
        return 120.0 + 3 * self.seconds * max(self.loads)


def open_loop_pass(url: str, worker: WorkerProc, variant: str, texts: Sequence[str],
                   rate: float, load: float, seconds: float, seed: int, timeout_s: float,
                   server: int | None) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` for ``seconds``, each request enqueued at its time and
    awaited by its own task."""
    from inferq.producer.aio import AsyncClient

    arrivals = poisson(rate, random.Random(seed), seconds=seconds)
    if not arrivals:
        raise BenchmarkFailed(f"no arrivals at {rate:.2f}/s in {seconds:g} s")

    async def run() -> Any:
        async with AsyncClient(url) as client:
            async def call(i: int) -> Any:
                handle = await client.enqueue(texts[i % len(texts)], model=worker.model)
                return await handle.result()
            return await open_loop(call, arrivals, watchdog([worker], timeout_s))

    probe = CpuProbe({"producer": None, "server": server, "worker": worker.pid}, children=True)
    probe.start()
    loaded = asyncio.run(run())
    cpu = probe.stop()
    records = [r for r in loaded.records if r is not None]
    results = [r for _, _, r in records]
    check_ok(results, len(arrivals), f"{variant} at {rate:.1f}/s")
    last = max(received for _, received, _ in records)
    n = len(records)
    out: dict[str, Any] = {
        "variant": variant, "load": load, "offered_rate": rate, "realised_rate": n / seconds,
        "requests": n, "achieved_throughput": n / max(last, 1e-9),
        "completed_in_period_per_s": sum(1 for _, rcv, _ in records if rcv <= seconds) / seconds,
        "latency_ms": pcts(loaded.latencies_ms),
        "redis_total_ms": pcts([r.total_ms for r in results if r.total_ms is not None]),
        "queue_wait_ms": pcts([r.queue_wait_ms for r in results
                               if r.queue_wait_ms is not None]),
        "mean_batch_per_request": statistics.fmean(r.batch_size or 0 for r in results),
        "batch_sizes": dict(sorted(batches_of(results).items())),
        "producer_worst_late_ms": loaded.worst_late_s * 1e3, "drain_s": max(0.0, last - seconds),
        "cpu_seconds": dict(cpu), "other_load": cpu.get("other_load")}
    lat = out["latency_ms"]
    say(f"  {variant:<4} load {load:4.0%} offered {rate:6.1f}/s -> "
        f"{out['achieved_throughput']:6.1f} req/s; latency p50/p90/p99 "
        f"{lat['p50']:.0f}/{lat['p90']:.0f}/{lat['p99']:.0f} ms; "
        f"batch {out['mean_batch_per_request']:.1f}; other load {load_str(out['other_load'])}")
    return out


def figures(cfg: LoadConfig, capacity: Mapping[str, float], rates: Mapping[float, float],
            skipped: Mapping[float, str], passes: Sequence[Mapping[str, Any]],
            exit_codes: Mapping[str, int | None]) -> dict[str, Any]:
    points: dict[str, dict[str, Any]] = {}
    for variant in ("full", "bs1"):
        for load in cfg.loads:
            ts = [p for p in passes if p["variant"] == variant and p["load"] == load]
            if ts:
                points.setdefault(variant, {})[f"{load:g}"] = {
                    "load": load, "offered_rate": rates[load],
                    **summarize_fields(
                        ts, "achieved_throughput", "realised_rate", "completed_in_period_per_s",
                        *(f"latency_{q}=latency_ms.{q}" for q in ("p50", "p90", "p99", "max")),
                        *(f"queue_wait_{q}=queue_wait_ms.{q}" for q in ("p50", "p99")),
                        "mean_batch_per_request", "producer_worst_late_ms", "other_load"),
                    "batch_sizes": merge_counters(t["batch_sizes"] for t in ts)}
    report: dict[str, Any] = {
        "capacity": dict(capacity), "offered_rates": {f"{k:g}": v for k, v in rates.items()},
        "bs1_skipped": {f"{k:g}": v for k, v in skipped.items()}, "points": points,
        "passes": list(passes), "worker_exit_codes": dict(exit_codes),
        "noise": noise_of(p.get("other_load") for p in passes)}
    if "1" in points.get("full", {}):
        report["at_capacity"] = {"achieved_over_offered": summary(
            [p["achieved_throughput"] / p["offered_rate"] for p in passes
             if p["variant"] == "full" and p["load"] == 1.0])}
    return report


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    pts, cap = r["points"], r["capacity"]

    def series(variant: str, key: str, label: str, style: str = "o-") -> charts.Series:
        ps = pts[variant].values()
        return charts.Series.of(label, [p["offered_rate"] for p in ps], [p[key] for p in ps],
                                style)

    names = {"full": ("full stack", "o"), "bs1": ("batch-1 worker", "s")}
    hlines = [(f"full stack, closed-loop capacity {cap['full']:.0f}/s", cap["full"])]
    if "limit" in cap:
        hlines.append((f"bare model, batch {cap['limit_batch_size']} (the limit) "
                       f"{cap['limit']:.0f}/s", cap["limit"]))
    if "bs1" in cap:
        hlines.append((f"batch-1 worker, closed-loop {cap['bs1']:.0f}/s", cap["bs1"]))
    variants = [v for v in names if v in pts]
    note = "median over trials, bars = min..max"
    return [
        charts.line_chart(folder / "embed-load-throughput.png",
                          title="MiniLM, open-loop Poisson arrivals: throughput",
                          xlabel="offered requests/s", ylabel="achieved requests/s",
                          series=[series(v, "achieved_throughput", "full stack (default worker)"
                                         if v == "full" else names[v][0], names[v][1] + "-")
                                  for v in variants],
                          hlines=hlines, diagonal=True, note=note),
        charts.line_chart(folder / "embed-load-latency.png",
                          title="MiniLM, open-loop Poisson arrivals: latency",
                          xlabel="offered requests/s",
                          ylabel="ms, scheduled arrival -> result (log scale)",
                          series=[series(v, f"latency_{q}", f"{names[v][0]} {q}",
                                         names[v][1] + dash)
                                  for v in variants for q, dash in (("p50", "-"), ("p99", "--"))],
                          logy=True, note=note),
        charts.batch_histograms(
            folder / "embed-load-batches.png",
            title="Batch sizes of the default worker by offered load (share of requests)",
            panels={f"{float(k):.0%} load ({p['offered_rate']:.0f}/s)": p["batch_sizes"]
                    for k, p in pts["full"].items()})]


def results_markdown(r: Mapping[str, Any]) -> str:
    c, cap = r["config"], r["capacity"]
    caps = [f"full stack {cap['full']:.1f} req/s" + (" (given)" if c["capacity"] else "")]
    if "bs1" in cap:
        caps.append(f"batch-1 worker {cap['bs1']:.1f} req/s")
    if "limit" in cap:
        tried = ", ".join(f"batch {b} {v:.1f}" for b, v in cap["limit_per_batch_size"].items())
        caps.append(f"bare model at its best batch size, {cap['limit_batch_size']} (the limit):"
                    f" {cap['limit']:.1f} req/s ({tried})")
    return render("embed-load", r, caps="; ".join(caps), skipped="".join(
        f"\n- Batch-1 worker skipped at {float(k):.0%}: {why}."
        for k, why in r["bs1_skipped"].items()), rows=render_rows("embed-load.row", (
            {**p, "label": label} for variant, label in (("full", "full stack"),
                                                         ("bs1", "batch-1 worker"))
            for p in r["points"].get(variant, {}).values())))


class EmbedLoad(Scenario[LoadConfig]):
    name = "embed-load"
    title = "MiniLM under open-loop Poisson arrivals"
    quick_help = "5 loads x 5 s, 1 trial (~2 min)"
    config = LoadConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def configure(self, args: argparse.Namespace) -> LoadConfig:
        if args.capacity_requests < 8:
            raise SystemExit(f"benchmarks {self.name}: --capacity-requests must be >= 8")
        return super().configure(args)

    def measure(self, run: Run[LoadConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        workers = start_workers(run.cleanup, url, run.log_dir, "embedload", bs1=cfg.bs1)
        needed = int(max(cfg.loads) * (cfg.capacity or 200.0) * cfg.seconds * 1.5) + 1000
        texts, warm = (corpus.sentences(n, seed=seed, min_words=MIN_WORDS, max_words=MAX_WORDS)
                       for n, seed in ((max(needed, cfg.capacity_requests), CORPUS_SEED),
                                       (cfg.warmup, WARMUP_SEED)))
        bare: BareModel | None = None
        if cfg.limit:
            say("loading the bare model in this process (for the limit)")
            bare = BareModel(minilm_path())
            for bs in cfg.limit_batch_sizes:
                bare.encode(warm, bs)
        say("waiting for the workers, then warming them up")
        warm_up(url, workers, warm, ready_timeout_s=cfg.ready_timeout_s, timeout_s=cfg.timeout_s)

        say("capacity (closed loop)")
        burst = texts[:cfg.capacity_requests]
        capacity: dict[str, Any] = {"full": cfg.capacity}
        bursts: dict[str, list[float]] = {}
        for variant, part in (("full", burst), ("bs1", burst[: max(8, len(burst) // 4)])):
            if variant in workers and not (variant == "full" and cfg.capacity):
                bursts[variant] = [closed_loop(url, workers[variant], part, cfg.timeout_s)[0]
                                   for _ in range(cfg.capacity_passes)]
                capacity[variant] = statistics.median(bursts[variant])
            if variant in capacity:
                say(f"  {variant}: {capacity[variant]:.1f} req/s"
                    + (" (given)" if variant not in bursts else ""))
        if bare is not None:
            per_bs = bare.rates(burst, cfg.limit_batch_sizes)
            best = max(per_bs, key=lambda b: per_bs[b])
            capacity.update(limit=per_bs[best], limit_batch_size=best,
                            limit_per_batch_size={str(k): v for k, v in per_bs.items()})
            del bare
        capacity["bursts"] = bursts

        rates = {load: load * capacity["full"] for load in cfg.loads}
        skipped = {load: (f"offered {rate:.1f}/s > {cfg.bs1_max_overload:g}x its capacity "
                          f"{capacity['bs1']:.1f}/s")
                   for load, rate in rates.items()
                   if "bs1" in capacity and rate > cfg.bs1_max_overload * capacity["bs1"]}
        passes: list[dict[str, Any]] = []
        offset = 0
        for trial, order in run.rotations(list(cfg.loads), lambda x: f"{x:.0%}"):
            for index, load in enumerate(order):
                variants = ["full"] + (["bs1"] if "bs1" in workers and load not in skipped else [])
                for variant in variants[::-1] if (trial + index) % 2 else variants:
                    sample = texts[offset:] + texts[:offset]
                    offset = (offset + int(rates[load] * cfg.seconds)) % len(texts)
                    passes.append({**open_loop_pass(
                        url, workers[variant], variant, sample, rates[load], load, cfg.seconds,
                        ARRIVAL_SEED + 1000 * trial + int(load * 100), cfg.timeout_s,
                        server.pid), "trial": trial})
        exit_codes = stop_all(server, workers)
        return figures(cfg, capacity, rates, skipped, passes, exit_codes)


SCENARIO = EmbedLoad()
