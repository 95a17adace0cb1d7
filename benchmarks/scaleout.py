"""Scenario ``scaleout``: throughput with 1, 2, 4, 8 and 16 worker processes serving one queue,
with the built-in ``sleep`` model (a fixed time per batch, no CPU: it models a GPU), its Redis
cost and what one Redis shard carries; the method is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from benchmarks import charts
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    flag,
    int_list,
    noise_of,
    render,
    render_rows,
)
from benchmarks.harness import (
    Cleanup,
    fmt_range,
    positive_float,
    positive_int,
    say,
    summary,
    verdict,
)
from benchmarks.stack import (
    SleepWindow,
    WorkerProc,
    add_worker_arguments,
    batches_of,
    check_ok,
    enqueue_and_await,
    fill_and_drain,
    load_str,
    merge_counters,
    paused,
    queue_probe,
    redis_delta,
    redis_snapshot,
    sleep_model,
    spawn_workers,
    stop_all,
    sum_cpu,
    summarize_fields,
    window_flags,
)

if TYPE_CHECKING:
    from inferq.protocol.codec import Result

MODEL = "sleep-scale"
TARGET_EFFICIENCY = 0.9
#: Redis utilisation a shard is planned at (headroom for bursts, AOF rewrites, failover).
PLANNING_UTILISATION = 0.7
#: Per-worker request rates the fleet-size estimate is tabulated for.
PER_WORKER_RATES = (100, 1_000, 5_000)


@dataclass(frozen=True)
class ScaleConfig(SleepWindow):
    worker_counts: tuple[int, ...] = flag(int_list, "1,2,4,8,16", "worker process counts, "
                                          "comma-separated", name="--workers")
    seconds: float = flag(positive_float, ByMode(20.0, 3.0), "work per pass, in seconds of "
                          "ideal throughput")
    chunk: int = flag(positive_int, 1000, "requests per enqueue_many call")
    mode: str = flag(default="drain", choices=("drain", "e2e"), help="drain: fill while "
                     "paused, then time the workers alone; e2e: the producer enqueues and "
                     "awaits while they run")
    timeout_s: float = 600.0

    def requests_for(self, workers: int) -> int:
        return max(self.max_batch_size * workers,
                   round(workers * self.worker_capacity * self.seconds))


# ------------------------------------------------------------------------------ passes


def _prompts(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i:08d}" for i in range(n)]


def _spread(results: Sequence[Result], workers: int) -> dict[str, Any]:
    """How evenly the work went to the workers: requests per worker, min/max over mean."""
    per = Counter(r.worker for r in results)
    counts = list(per.values()) + [0] * max(0, workers - len(per))
    mean = statistics.fmean(counts) if counts else 0.0
    return {"per_worker": dict(sorted(per.items())), "workers_used": len(per),
            "min_over_mean": min(counts) / mean if mean else None,
            "max_over_mean": max(counts) / mean if mean else None}


def drain_pass(cleanup: Cleanup, url: str, workers: Sequence[WorkerProc], n: int,
               cfg: ScaleConfig, tag: str, server: int | None) -> dict[str, Any]:
    count = cfg.requests_for(n)
    d = fill_and_drain(cleanup, url, MODEL, _prompts(tag, count), chunk=cfg.chunk,
                       paused_workers=workers, active=workers[:n], server=server,
                       timeout_s=cfg.timeout_s)
    check_ok(d.results, count, f"{n} workers")
    return _pass_result(n, count, d.throughput, d.wall_s, d.results, d.cpu,
                        asdict(d.redis_drain), asdict(d.redis_fill), cfg)


def e2e_pass(cleanup: Cleanup, url: str, workers: Sequence[WorkerProc], n: int,
             cfg: ScaleConfig, tag: str, server: int | None) -> dict[str, Any]:
    count = cfg.requests_for(n)
    prompts = _prompts(tag, count)
    client = redis.Redis.from_url(url)
    probe = queue_probe(server, [w.pid for w in workers[:n]])
    with paused(cleanup, [w.pid for w in workers[n:]]):
        before = redis_snapshot(client)
        probe.start()
        results, seconds, _ = asyncio.run(enqueue_and_await(
            url, MODEL, prompts, cfg.chunk, workers[:n], cfg.timeout_s))
        cpu = probe.stop()
        after = redis_snapshot(client)
    client.close()
    check_ok(results, count, f"{n} workers")
    work = redis_delta(before, after, count)
    return _pass_result(n, count, count / seconds, seconds, results, cpu, asdict(work), None,
                        cfg)


def _pass_result(n: int, count: int, throughput: float, wall_s: float,
                 results: Sequence[Result], cpu: Mapping[str, float | None],
                 redis_work: dict[str, Any], redis_fill: dict[str, Any] | None,
                 cfg: ScaleConfig) -> dict[str, Any]:
    sizes = batches_of(results)
    worker_cpu = sum_cpu(cpu, "worker")
    out: dict[str, Any] = {
        "workers": n, "requests": count, "throughput": throughput, "wall_s": wall_s,
        "per_worker": throughput / n, "efficiency_vs_ideal": throughput / (
            n * cfg.worker_capacity),
        "batch_sizes": dict(sorted(sizes.items())),
        "mean_batch_size": count / max(sum(sizes.values()), 1),
        "spread": _spread(results, n), "cpu_seconds": dict(cpu),
        "other_load": cpu.get("other_load"),
        "worker_cpu_us_per_request": None if worker_cpu is None else worker_cpu / count * 1e6,
        "redis": redis_work, "redis_fill": redis_fill,
    }
    say(f"  {n:>2} workers: {throughput:8.1f} req/s ({out['per_worker']:.1f}/worker, "
        f"{out['efficiency_vs_ideal']:.2f} of ideal), mean batch {out['mean_batch_size']:.1f};"
        f" Redis {redis_work['ops_per_s']:.0f} ops/s, {redis_work['commands_per_request']:.1f}"
        f" cmds/req, CPU {redis_work['cpu_share']:.1%} of a core; other load "
        f"{load_str(out['other_load'])}")
    return out


def _rss_mib(pids: Sequence[int]) -> dict[str, float | None]:
    values: list[float] = []
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    values.append(int(line.split()[1]) / 1024)
        except OSError:
            pass
    return {"per_worker_median": statistics.median(values) if values else None,
            "total": sum(values) if values else None}


# ------------------------------------------------------------------------------ reports


def figures(cfg: ScaleConfig, trials: Mapping[int, Sequence[Mapping[str, Any]]],
            rss: Mapping[str, Any], exit_codes: Mapping[str, int | None]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    base = min(trials)
    per_count: dict[str, Any] = {}
    for n, ts in trials.items():
        # Linear = n x the single-worker throughput of the same trial (paired; drift cancels).
        eff = [t["throughput"] / (n / base * b["throughput"])
               for t, b in zip(ts, trials[base], strict=True)]
        per_count[str(n)] = {
            "workers": n,
            **summarize_fields(ts, "throughput", "per_worker"),
            "efficiency_vs_linear": summary(eff),
            **summarize_fields(
                ts, "efficiency_vs_ideal", "mean_batch_size", "redis.ops_per_s",
                "redis.commands_per_request", "redis.client_commands_per_request",
                "redis.cpu_us_per_request", "redis.cpu_share",
                "enqueue_redis_cpu_us_per_request=redis_fill.cpu_us_per_request",
                "enqueue_redis_commands_per_request=redis_fill.commands_per_request",
                "worker_cpu_us_per_request", "spread.min_over_mean", "other_load"),
            "batch_sizes": merge_counters(t["batch_sizes"] for t in ts),
            "trials": list(ts),
        }
    report["per_count"] = per_count
    report["worker_rss_mib"] = dict(rss)
    report["worker_exit_codes"] = dict(exit_codes)
    report["noise"] = noise_of(t.get("other_load") for ts in trials.values() for t in ts)
    top = per_count[str(max(trials))]
    eff = top["efficiency_vs_linear"]["median"]
    report["target"] = {"efficiency_vs_linear_at_max": eff, "target": TARGET_EFFICIENCY,
                        "workers": max(trials),
                        "verdict": verdict(eff, TARGET_EFFICIENCY)}
    fit = redis_cpu_fit([t for ts in trials.values() for t in ts])
    report["redis_cpu_fit"] = fit
    report["shard_estimate"] = shard_estimate(per_count[str(max(trials))], fit, cfg)
    return report


def redis_cpu_fit(passes: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Least-squares line through (throughput, Redis CPU share of a core) over all passes:
    the slope is Redis' CPU per request (microseconds), the intercept its fixed load (serverCron,
    AOF fsync, heartbeats, idle workers' blocking calls), which inflates the per-request figure
    of a slow pass."""
    points = [(float(t["throughput"]), float(t["redis"]["cpu_share"])) for t in passes]
    if len({x for x, _ in points}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return {"us_per_request": slope * 1e6, "fixed_share_of_core": my - slope * mx,
            "passes": float(len(points))}


def shard_estimate(top: Mapping[str, Any], fit: Mapping[str, float] | None,
                   cfg: ScaleConfig) -> dict[str, Any]:
    """Requests/s one Redis shard carries, from the Redis CPU a request costs (enqueue in the
    fill, claim + complete in the drain: the marginal cost from ``redis_cpu_fit`` when there is
    one), at a planning utilisation of one core."""
    enqueue = top["enqueue_redis_cpu_us_per_request"]["median"]
    drain = fit["us_per_request"] if fit else top["redis_cpu_us_per_request"]["median"]
    # e2e: the pass's own figure already includes the enqueue.
    both = cfg.mode == "drain" and enqueue is not None and drain is not None
    total = (enqueue or 0.0) + (drain or 0.0) if both else drain
    if not total:
        return {}
    capacity = 1e6 / total
    return {
        "redis_cpu_us_per_request": total, "enqueue_us": enqueue, "claim_complete_us": drain,
        "marginal": fit is not None,
        "batch_size": cfg.max_batch_size, "requests_per_s_at_full_core": capacity,
        "planning_utilisation": PLANNING_UTILISATION,
        "requests_per_s_planned": capacity * PLANNING_UTILISATION,
        "workers_per_shard": {str(rate): capacity * PLANNING_UTILISATION / rate
                              for rate in PER_WORKER_RATES},
        "commands_per_request": (top["redis_commands_per_request"]["median"] or 0.0) + (
            top["enqueue_redis_commands_per_request"]["median"] or 0.0),
    }


def draw_plots(r: Mapping[str, Any], folder: Path) -> list[Path]:
    pc = r["per_count"]
    xs = [float(k) for k in pc]
    base = pc[str(min(int(k) for k in pc))]["throughput"]["median"] or 0.0
    ideal = r["config"]["worker_capacity"]
    measured = charts.Series.of("measured (median, min..max)", xs,
                                [s["throughput"] for s in pc.values()])
    linear = charts.Series("linear (n x measured 1 worker)", xs, [x * base for x in xs],
                           style="--")
    perfect = charts.Series(f"ideal (n x {ideal:.0f} req/s: full batches back to back)", xs,
                            [x * ideal for x in xs], style=":")
    p1 = charts.line_chart(
        folder / "scaleout-throughput.png",
        title=f"Scale-out: sleep model, {r['config']['full_batch_ms']:.0f} ms per batch of "
              f"{r['config']['max_batch_size']}", xlabel="worker processes",
        ylabel="requests/s", series=[measured, linear, perfect], logx=True, xticks=xs,
        note=f"mode {r['config']['mode']}; one queue, one Redis server (AOF everysec)")
    eff = charts.Series.of("efficiency vs linear", xs,
                           [s["efficiency_vs_linear"] for s in pc.values()])
    redis_share = charts.Series("Redis CPU, share of one core", xs,
                                [pc[k]["redis_cpu_share"]["median"] for k in pc], style="s--")
    p2 = charts.line_chart(
        folder / "scaleout-efficiency.png", title="Scale-out efficiency and Redis load",
        xlabel="worker processes", ylabel="fraction", series=[eff, redis_share],
        hlines=[(f"target {TARGET_EFFICIENCY}", TARGET_EFFICIENCY)], logx=True, xticks=xs,
        note="Redis ops/s per worker count are in the table")
    return [p1, p2]


def results_markdown(r: Mapping[str, Any]) -> str:
    c, pc, est, fit = r["config"], r["per_count"], r["shard_estimate"], r.get("redis_cpu_fit")
    estimate = "" if not est else render(
        "scaleout.shard", est, enqueue=est["enqueue_us"] or 0,
        fit_text=render("scaleout.fit", fit).rstrip() if fit else "at the largest worker count",
        fleet=render_rows("scaleout.fleet", ({"rate": int(rate), "n": n}
                                             for rate, n in est["workers_per_shard"].items())))
    return render(
        "scaleout", r, mode=render(f"scaleout.{c['mode']}", {}).rstrip(), estimate=estimate,
        rss=r["worker_rss_mib"]["per_worker_median"] or 0,
        efficiency=fmt_range(pc[str(r["target"]["workers"])]["efficiency_vs_linear"], 2),
        rows=render_rows("scaleout.row", pc.values()))


# ------------------------------------------------------------------------------ scenario


class Scaleout(Scenario[ScaleConfig]):
    name = "scaleout"
    title = "1 to 16 workers on one queue (sleep model)"
    quick_help = "3 s of work per worker count, 1 trial (~1 min)"
    config = ScaleConfig
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_worker_arguments(parser, max_batch_size=16, max_wait_ms=5.0, batch_ms=50.0)

    def configure(self, args: argparse.Namespace) -> ScaleConfig:
        if args.batch_ms + args.item_ms <= 0:
            raise SystemExit(f"benchmarks {self.name}: --batch-ms + --item-ms must be > 0")
        return super().configure(args)

    def measure(self, run: Run[ScaleConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        spid = server.pid
        fleet_size = max(cfg.worker_counts)
        say(f"{self.name} benchmark ({cfg.mode}): workers {list(cfg.worker_counts)}, "
            f"{cfg.seconds:g} s of work per pass x {run.trials} trial(s); batch "
            f"{cfg.full_batch_ms:.1f} ms for {cfg.max_batch_size} requests = "
            f"{cfg.worker_capacity:.0f} req/s per worker ideal")
        ids = [f"bench-scale-{i:02d}" for i in range(fleet_size)]
        workers = spawn_workers(run.cleanup, url, ids, log_dir=run.log_dir,
                                model_arg=sleep_model(MODEL, cfg.batch_ms, cfg.item_ms),
                                flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
        say(f"{fleet_size} workers ready; warming up")
        warm = _prompts("warm", cfg.requests_for(fleet_size) // 10
                        + fleet_size * cfg.max_batch_size)
        check_ok(fill_and_drain(run.cleanup, url, MODEL, warm, chunk=cfg.chunk,
                                paused_workers=workers, active=workers, server=spid,
                                timeout_s=cfg.timeout_s).results, len(warm), "warm-up")
        rss = _rss_mib([w.pid for w in workers])

        trials: dict[int, list[dict[str, Any]]] = {n: [] for n in cfg.worker_counts}
        run_pass = drain_pass if cfg.mode == "drain" else e2e_pass
        for trial, order in run.rotations(list(cfg.worker_counts)):
            for n in order:
                trials[n].append(run_pass(run.cleanup, url, workers, n, cfg, f"t{trial}n{n}",
                                          spid))
        exit_codes = stop_all(server, {w.worker_id: w for w in workers})
        return figures(cfg, trials, rss, exit_codes)


SCENARIO = Scaleout()
