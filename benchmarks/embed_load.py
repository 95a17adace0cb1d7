"""Scenario ``embed-load``: MiniLM embeddings under open-loop Poisson arrivals at several offered
loads, as fractions of the full stack's measured capacity.

    python -m benchmarks embed-load            # 5 loads x 30 s x 3 trials (~15 min)
    python -m benchmarks embed-load --quick    # smoke test: 5 loads x 5 s, 1 trial (~2 min)

The stack is the one of ``embed``: an embedded server with AOF, a default worker
(``python -m inferq worker --model minilm --device cpu``) and, for comparison, the same worker
with ``--max-batch-size 1``, over the same deterministic ~33-token sentences.

1. Capacity: a closed-loop burst through each worker (every request enqueued at once, N /
   (first enqueue -> last result)), and the bare model in this process at its best batch size
   (``--limit-batch-size``, "the limit", as in ``embed``).
2. Sweep: for each offered load (default 25/50/75/100/125% of the full stack's capacity),
   requests arrive as a Poisson process for ``--seconds``: each is enqueued at its scheduled
   time, whatever happened to the earlier ones (open loop), and awaited by its own task.
   Latency = result received - scheduled arrival, so a producer that falls behind cannot hide
   queueing (no coordinated omission). Achieved throughput = requests / (first arrival -> last
   result). The batch-1 worker runs the same absolute rates where it can keep up within
   ``--bs1-max-overload`` of its own capacity (beyond that its backlog would take minutes to
   drain; the report says which loads it skipped).

Loads are rotated per trial; the offered rates stay the same in every trial.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import charts, corpus
from benchmarks.embed import MAX_WORDS, MIN_WORDS, start_workers
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    float_list,
    int_list,
    noise_of,
    positive_float,
    positive_int,
)
from benchmarks.harness import (
    BenchmarkFailed,
    CpuProbe,
    fmt_range,
    markdown_table,
    say,
    stop_child,
    summary,
)
from benchmarks.models import BareModel, minilm_path
from benchmarks.stack import (
    WorkerProc,
    batches_of,
    check_ok,
    closed_loop,
    gather_watched,
    load_str,
    merge_counters,
    pcts,
    scaled,
    summarize_trials,
    warm_up,
)

if TYPE_CHECKING:
    from inferq.producer.aio import AsyncHandle
    from inferq.protocol.codec import Result

CORPUS_SEED = 20240611
WARMUP_SEED = 11
ARRIVAL_SEED = 4242
START_DELAY_S = 0.05


@dataclass(frozen=True)
class LoadConfig:
    loads: tuple[float, ...]
    seconds: float
    capacity_requests: int
    capacity: float | None
    capacity_passes: int
    bs1: bool
    bs1_max_overload: float
    limit: bool
    limit_batch_sizes: tuple[int, ...]
    warmup: int
    ready_timeout_s: float = 300.0

    @property
    def timeout_s(self) -> float:
        return 120.0 + 3 * self.seconds * max(self.loads)


# ---------------------------------------------------------------------------- open loop


def poisson_arrivals(rate: float, seconds: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    t = rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def _open_loop(url: str, worker: WorkerProc, texts: Sequence[str],
                     arrivals: Sequence[float], timeout_s: float
                     ) -> tuple[list[tuple[float, float, Result]], float]:
    """Enqueue each text at its arrival time (the due ones together when the producer runs
    late) and await each in its own task. Returns (scheduled, received, result) per request,
    in seconds since the start, and the producer's worst lateness in seconds."""
    from inferq.producer.aio import AsyncClient

    records: list[tuple[float, float, Result]] = []
    worst_late = 0.0
    async with AsyncClient(url) as client:
        t0 = time.perf_counter() + START_DELAY_S
        tasks: list[asyncio.Task[None]] = []

        async def wait(handle: AsyncHandle, scheduled: float) -> None:
            result = await handle.result()
            records.append((scheduled, time.perf_counter() - t0, result))

        i, n = 0, len(arrivals)
        while i < n:
            now = time.perf_counter() - t0
            if arrivals[i] > now:
                await asyncio.sleep(arrivals[i] - now)
                continue
            j = i
            while j < n and arrivals[j] <= now:
                j += 1
            worst_late = max(worst_late, now - arrivals[i])
            batch = [texts[k % len(texts)] for k in range(i, j)]
            if len(batch) == 1:
                handles = [await client.enqueue(batch[0], model=worker.model, task="embed")]
            else:
                handles = await client.enqueue_many(batch, model=worker.model, task="embed")
            tasks += [asyncio.create_task(wait(h, arrivals[i + k]))
                      for k, h in enumerate(handles)]
            i = j
        await gather_watched(tasks, [worker], timeout_s)
    return records, worst_late


def open_loop_pass(url: str, worker: WorkerProc, variant: str, texts: Sequence[str],
                   rate: float, load: float, seconds: float, seed: int, timeout_s: float,
                   server: int | None) -> dict[str, Any]:
    arrivals = poisson_arrivals(rate, seconds, random.Random(seed))
    if not arrivals:
        raise BenchmarkFailed(f"no arrivals at {rate:.2f}/s in {seconds:g} s")
    probe = CpuProbe({"producer": None, "server": server, "worker": worker.pid}, children=True)
    probe.start()
    records, late = asyncio.run(_open_loop(url, worker, texts, arrivals, timeout_s))
    cpu = probe.stop()
    results = [r for _, _, r in records]
    check_ok(results, len(arrivals), f"{variant} at {rate:.1f}/s")
    latency = [(received - scheduled) * 1e3 for scheduled, received, _ in records]
    last = max(received for _, received, _ in records)
    sizes = batches_of(results)
    n = len(records)
    out: dict[str, Any] = {
        "variant": variant, "load": load, "offered_rate": rate,
        "realised_rate": n / seconds, "requests": n,
        "achieved_throughput": n / max(last, 1e-9),
        "completed_in_period_per_s": sum(1 for _, rcv, _ in records if rcv <= seconds) / seconds,
        "latency_ms": pcts(latency),
        "redis_total_ms": pcts([r.total_ms for r in results if r.total_ms is not None]),
        "queue_wait_ms": pcts([r.queue_wait_ms for r in results
                               if r.queue_wait_ms is not None]),
        "mean_batch_per_request": statistics.fmean(r.batch_size or 0 for r in results),
        "batch_sizes": dict(sorted(sizes.items())),
        "producer_worst_late_ms": late * 1e3, "drain_s": max(0.0, last - seconds),
        "cpu_seconds": dict(cpu), "other_load": cpu.get("other_load"),
    }
    lat = out["latency_ms"]
    say(f"  {variant:<4} load {load:4.0%} offered {rate:6.1f}/s -> "
        f"{out['achieved_throughput']:6.1f} req/s; latency p50/p90/p99 "
        f"{lat['p50']:.0f}/{lat['p90']:.0f}/{lat['p99']:.0f} ms; "
        f"batch {out['mean_batch_per_request']:.1f}; other load {load_str(out['other_load'])}")
    return out


# ------------------------------------------------------------------------------ reports


def figures(cfg: LoadConfig, capacity: Mapping[str, float], rates: Mapping[float, float],
            skipped: Mapping[float, str], passes: Sequence[Mapping[str, Any]],
            exit_codes: Mapping[str, int | None]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    report["capacity"] = dict(capacity)
    report["offered_rates"] = {f"{k:g}": v for k, v in rates.items()}
    report["bs1_skipped"] = {f"{k:g}": v for k, v in skipped.items()}
    points: dict[str, dict[str, Any]] = {}
    for variant in ("full", "bs1"):
        for load in cfg.loads:
            ts = [p for p in passes if p["variant"] == variant and p["load"] == load]
            if not ts:
                continue
            points.setdefault(variant, {})[f"{load:g}"] = {
                "load": load, "offered_rate": rates[load],
                "achieved_throughput": summarize_trials(ts, ["achieved_throughput"]),
                "realised_rate": summarize_trials(ts, ["realised_rate"]),
                "completed_in_period_per_s": summarize_trials(ts, ["completed_in_period_per_s"]),
                **{f"latency_{q}": summarize_trials(ts, ["latency_ms", q])
                   for q in ("p50", "p90", "p99", "max")},
                **{f"queue_wait_{q}": summarize_trials(ts, ["queue_wait_ms", q])
                   for q in ("p50", "p99")},
                "mean_batch_per_request": summarize_trials(ts, ["mean_batch_per_request"]),
                "producer_worst_late_ms": summarize_trials(ts, ["producer_worst_late_ms"]),
                "other_load": summarize_trials(ts, ["other_load"]),
                "batch_sizes": merge_counters(t["batch_sizes"] for t in ts),
            }
    report["points"] = points
    report["passes"] = list(passes)
    report["worker_exit_codes"] = dict(exit_codes)
    report["noise"] = noise_of(p.get("other_load") for p in passes)
    at_capacity = points.get("full", {}).get("1")
    if at_capacity is not None:
        report["at_capacity"] = {"achieved_over_offered": summary(
            [p["achieved_throughput"] / p["offered_rate"] for p in passes
             if p["variant"] == "full" and p["load"] == 1.0])}
    return report


def _series(points: Mapping[str, Any], key: str, label: str, style: str = "o-"
            ) -> charts.Series:
    xs = [p["offered_rate"] for p in points.values()]
    return charts.Series(label, xs, [p[key]["median"] for p in points.values()],
                         [p[key]["min"] for p in points.values()],
                         [p[key]["max"] for p in points.values()], style=style)


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    pts, cap = r["points"], r["capacity"]
    tput = [_series(pts["full"], "achieved_throughput", "full stack (default worker)")]
    if "bs1" in pts:
        tput.append(_series(pts["bs1"], "achieved_throughput", "batch-1 worker", "s-"))
    hlines = [(f"full stack, closed-loop capacity {cap['full']:.0f}/s", cap["full"])]
    if "limit" in cap:
        hlines.append((f"bare model, batch {cap['limit_batch_size']} (the limit) "
                       f"{cap['limit']:.0f}/s", cap["limit"]))
    if "bs1" in cap:
        hlines.append((f"batch-1 worker, closed-loop {cap['bs1']:.0f}/s", cap["bs1"]))
    p1 = charts.line_chart(folder / "embed-load-throughput.png",
                           title="MiniLM, open-loop Poisson arrivals: throughput",
                           xlabel="offered requests/s", ylabel="achieved requests/s",
                           series=tput, hlines=hlines, diagonal=True,
                           note="median over trials, bars = min..max")
    lat = [_series(pts["full"], "latency_p50", "full stack p50"),
           _series(pts["full"], "latency_p99", "full stack p99", "o--")]
    if "bs1" in pts:
        lat += [_series(pts["bs1"], "latency_p50", "batch-1 worker p50", "s-"),
                _series(pts["bs1"], "latency_p99", "batch-1 worker p99", "s--")]
    p2 = charts.line_chart(folder / "embed-load-latency.png",
                           title="MiniLM, open-loop Poisson arrivals: latency",
                           xlabel="offered requests/s",
                           ylabel="ms, scheduled arrival -> result (log scale)", series=lat,
                           logy=True, note="median over trials, bars = min..max")
    panels = {f"{float(k):.0%} load ({p['offered_rate']:.0f}/s)": p["batch_sizes"]
              for k, p in pts["full"].items()}
    p3 = charts.batch_histograms(folder / "embed-load-batches.png",
                                 title="Batch sizes of the default worker by offered load "
                                       "(share of requests)", panels=panels)
    return [p1, p2, p3]


def _ms(s: Mapping[str, Any]) -> str:
    return fmt_range(s, 0)


def results_markdown(r: Mapping[str, Any]) -> str:
    c, cap = r["config"], r["capacity"]
    rows = []
    for variant, label in (("full", "full stack"), ("bs1", "batch-1 worker")):
        for k, p in r["points"].get(variant, {}).items():
            rows.append([f"{float(k):.0%}",
                         f"{p['offered_rate']:.1f} ({fmt_range(p['realised_rate'])})", label,
                         fmt_range(p["achieved_throughput"]),
                         f"{_ms(p['latency_p50'])} / {_ms(p['latency_p90'])} / "
                         f"{_ms(p['latency_p99'])}",
                         f"{_ms(p['queue_wait_p50'])} / {_ms(p['queue_wait_p99'])}",
                         fmt_range(p["mean_batch_per_request"]),
                         fmt_range(scaled(p["other_load"], 100), 0)])
    table = markdown_table(["load", "offered req/s (Poisson draw)", "variant", "achieved req/s",
                            "latency ms p50 / p90 / p99", "queue wait ms p50 / p99",
                            "mean batch (per request)", "other tenants' load %"], rows)
    caps = [f"full stack {cap['full']:.1f} req/s" + (" (given)" if c["capacity"] else "")]
    if "bs1" in cap:
        caps.append(f"batch-1 worker {cap['bs1']:.1f} req/s")
    if "limit" in cap:
        tried = ", ".join(f"batch {b} {v:.1f}" for b, v in cap["limit_per_batch_size"].items())
        caps.append(f"bare model at its best batch size, {cap['limit_batch_size']} (the limit):"
                    f" {cap['limit']:.1f} req/s ({tried})")
    skipped = "".join(f"\n- Batch-1 worker skipped at {float(k):.0%}: {why}."
                      for k, why in r["bs1_skipped"].items())
    return f"""- Stack: as in `embed` (embedded server with AOF, `python -m inferq worker --model minilm --device cpu` with default flags, and a `--max-batch-size 1` worker), ~33-token sentences.
- Capacity, closed loop ({c['capacity_requests']} requests at once, median of {c['capacity_passes']} burst(s); a quarter of that for the batch-1 worker): {'; '.join(caps)}.
- Sweep: Poisson arrivals for {c['seconds']:g} s per load, each request enqueued at its scheduled time and awaited by its own task; latency = result received - scheduled arrival; achieved = requests / (first arrival -> last result). {c['trials']} trial(s), loads rotated per trial; median (min..max) over trials.{skipped}

{table}

Under capacity, achieved = offered and latency is a batch or two; past it, the backlog grows
for the whole period, so latency grows with the period's length and achieved throughput is
the capacity. The batch-size histograms show the adaptive window at work: small batches
under a trickle, full ones under load.
"""  # noqa: E501


# ------------------------------------------------------------------------------ scenario


class EmbedLoad(Scenario[LoadConfig]):
    name = "embed-load"
    title = "MiniLM under open-loop Poisson arrivals"
    quick_help = "5 loads x 5 s, 1 trial (~2 min)"
    config = LoadConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--loads", type=float_list, default=(0.25, 0.5, 0.75, 1.0, 1.25),
                            help="offered loads as fractions of the full stack's capacity "
                                 "(default 0.25,0.5,0.75,1.0,1.25)")
        parser.add_argument("--seconds", type=positive_float, default=ByMode(30.0, 5.0),
                            help="arrival period per load (default %(default)s)")
        parser.add_argument("--capacity-requests", type=positive_int, default=ByMode(1000, 200),
                            help="requests in the closed-loop capacity burst, at least 8 "
                                 "(default %(default)s); the batch-1 worker gets a quarter")
        parser.add_argument("--capacity", type=positive_float, default=None,
                            help="use this full-stack capacity (req/s) instead of measuring it")
        parser.add_argument("--capacity-passes", type=positive_int, default=ByMode(3, 1),
                            help="closed-loop bursts for the capacity; the median is used "
                                 "(default %(default)s)")
        parser.add_argument("--no-bs1", dest="bs1", action="store_false",
                            help="leave out the batch-1 worker")
        parser.add_argument("--bs1-max-overload", type=positive_float, default=ByMode(1.5, 1.0),
                            help="run the batch-1 worker at a load only when the offered rate is "
                                 "at most this multiple of its own capacity "
                                 "(default %(default)s)")
        parser.add_argument("--no-limit", dest="limit", action="store_false",
                            help="do not load the bare model in this process for the limit line")
        parser.add_argument("--limit-batch-sizes", type=int_list, default=(8, 16, 32),
                            help="bare-model batch sizes tried for the limit, the best counts "
                                 "(default 8,16,32)")
        parser.add_argument("--warmup", type=positive_int, default=ByMode(256, 64),
                            help="warm-up requests for the full worker, a quarter for the "
                                 "batch-1 worker (default %(default)s)")

    def configure(self, args: argparse.Namespace) -> LoadConfig:
        if args.capacity_requests < 8:
            raise SystemExit(f"benchmarks {self.name}: --capacity-requests must be >= 8")
        return super().configure(args)

    def measure(self, run: Run[LoadConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        spid = server.pid
        workers = start_workers(run.cleanup, url, run.log_dir, "embedload", bs1=cfg.bs1)
        needed = int(max(cfg.loads) * (cfg.capacity or 200.0) * cfg.seconds * 1.5) + 1000
        texts = corpus.sentences(max(needed, cfg.capacity_requests), seed=CORPUS_SEED,
                                 min_words=MIN_WORDS, max_words=MAX_WORDS)
        warm = corpus.sentences(cfg.warmup, seed=WARMUP_SEED, min_words=MIN_WORDS,
                                max_words=MAX_WORDS)
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
        capacity: dict[str, Any] = {}
        bursts: dict[str, list[float]] = {}
        if cfg.capacity is None:
            bursts["full"] = [closed_loop(url, workers["full"], burst, cfg.timeout_s)[0]
                              for _ in range(cfg.capacity_passes)]
            capacity["full"] = statistics.median(bursts["full"])
            say(f"  full stack: {capacity['full']:.1f} req/s "
                f"({', '.join(f'{x:.1f}' for x in bursts['full'])})")
        else:
            capacity["full"] = cfg.capacity
            say(f"  full stack: {cfg.capacity:.1f} req/s (given)")
        if "bs1" in workers:
            small = burst[: max(8, len(burst) // 4)]
            bursts["bs1"] = [closed_loop(url, workers["bs1"], small, cfg.timeout_s)[0]
                             for _ in range(cfg.capacity_passes)]
            capacity["bs1"] = statistics.median(bursts["bs1"])
            say(f"  batch-1 worker: {capacity['bs1']:.1f} req/s")
        if bare is not None:
            per_bs: dict[int, float] = {}
            for bs in cfg.limit_batch_sizes:
                t0 = time.perf_counter()
                bare.encode(burst, bs)
                per_bs[bs] = len(burst) / (time.perf_counter() - t0)
            best = max(per_bs, key=lambda b: per_bs[b])
            capacity["limit"] = per_bs[best]
            capacity["limit_batch_size"] = best
            capacity["limit_per_batch_size"] = {str(k): v for k, v in per_bs.items()}
            say(f"  bare model: {', '.join(f'batch {b} {v:.1f}' for b, v in per_bs.items())} "
                f"req/s; the limit is batch {best}")
            del bare
        capacity["bursts"] = bursts

        rates = {load: load * capacity["full"] for load in cfg.loads}
        skipped = {load: (f"offered {rate:.1f}/s > {cfg.bs1_max_overload:g}x its capacity "
                          f"{capacity['bs1']:.1f}/s")
                   for load, rate in rates.items()
                   if "bs1" in capacity and rate > cfg.bs1_max_overload * capacity["bs1"]}
        passes: list[dict[str, Any]] = []
        loads = list(cfg.loads)
        offset = 0
        for trial in range(run.trials):
            shift = trial % len(loads)
            order = loads[shift:] + loads[:shift]
            say(f"trial {trial + 1}/{run.trials}: loads {', '.join(f'{x:.0%}' for x in order)}")
            for index, load in enumerate(order):
                variants = ["full"] + (["bs1"] if "bs1" in workers and load not in skipped else [])
                if (trial + index) % 2:
                    variants.reverse()
                for variant in variants:
                    seed = ARRIVAL_SEED + 1000 * trial + int(load * 100)
                    sample = texts[offset:] + texts[:offset]
                    offset = (offset + int(rates[load] * cfg.seconds)) % len(texts)
                    result = open_loop_pass(url, workers[variant], variant, sample, rates[load],
                                            load, cfg.seconds, seed, cfg.timeout_s, spid)
                    result["trial"] = trial
                    passes.append(result)

        say("stopping the workers and the server")
        exit_codes = {v: stop_child(w.child) for v, w in workers.items()}
        server.stop()
        return figures(cfg, capacity, rates, skipped, passes, exit_codes)


SCENARIO = EmbedLoad()
