"""Scenario ``slo``: latency objectives under overload. A sleep-model queue gets 1.5x its
capacity from two classes at the same priority, interactive (objective 1 s) and relaxed
(30 s), through three queue policies side by side: today's FIFO (``--order fair``, no
tenants), ``--order deadline``, and ``--order deadline --admission predicted``
(``inferq queue set``). Each variant has a fresh queue and worker; the method and targets are
in issue 37 and docs/guides/latency-objectives.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

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
from benchmarks.stack import (
    SleepWindow,
    add_worker_arguments,
    check_alive,
    pcts,
    queue_probe,
    read_written,
    sleep_model,
    spawn_workers,
    summarize_trials,
    window_flags,
)

if TYPE_CHECKING:
    from inferq.producer.aio import AsyncClient, AsyncHandle

#: variant -> (order, admission)
VARIANTS: dict[str, tuple[str, str]] = {
    "fifo": ("fair", "off"), "deadline": ("deadline", "off"),
    "deadline_admission": ("deadline", "predicted")}
TICK_S = 0.02
SEED = 20261205
#: Targets of issue 37 for deadline + admission against FIFO.
GOODPUT_FACTOR = 1.5
INTERACTIVE_ATTAINMENT = 0.95
LATENESS_FACTOR = 2.0
REFUSAL_MS = 5.0


@dataclass(frozen=True)
class SloConfig(SleepWindow):
    seconds: float = flag(positive_float, ByMode(30.0, 8.0), "arrivals per variant (s)")
    overload: float = flag(positive_float, 1.5, "arrival rate / capacity")
    interactive_share: float = flag(positive_float, 0.8, "share of arrivals that are "
                                                          "interactive")
    interactive_slo_ms: int = flag(positive_int, 1000, "the interactive class's objective")
    relaxed_slo_ms: int = flag(positive_int, 30_000, "the relaxed class's objective")
    warmup_s: float = flag(positive_float, ByMode(3.0, 2.0),
                           "requests at 0.5x capacity first, so the worker fits its latency")

    @property
    def capacity(self) -> float:
        return self.worker_capacity

    @property
    def rate(self) -> float:
        return self.overload * self.capacity


@dataclass
class Sent:
    id: str
    interactive: bool
    predicted_ms: int | None = None


@dataclass
class VariantData:
    sent: list[Sent] = field(default_factory=list)
    refused: list[Sent] = field(default_factory=list)
    #: Wall ms of each enqueue call that had a refusal in it.
    refusal_call_ms: list[float] = field(default_factory=list)
    flood_s: float = 0.0


async def _set_policy(client: AsyncClient, model: str, order: str, admission: str) -> None:
    from inferq.protocol.keys import QueueKeys
    from inferq.protocol.settings import SET_SETTINGS, settings_call

    keys, args = settings_call(QueueKeys.for_model("embed", model).config, None, "keep",
                               order=order, admission=admission)
    await client.redis.eval(SET_SETTINGS, len(keys), *keys, *args)


async def _warm_up(client: AsyncClient, model: str, cfg: SloConfig) -> None:
    """Half the capacity for ``warmup_s`` without objectives, then until the queue is empty:
    the worker has fitted (and published) its batch latency when the flood starts."""
    handles: list[AsyncHandle] = []
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < cfg.warmup_s:
        due = int(0.5 * cfg.capacity * elapsed) - len(handles)
        if due > 0:
            handles += await client.enqueue_many(
                [f"warm-{len(handles) + i}" for i in range(due)], model=model)
        await asyncio.sleep(TICK_S)
    await client.results(handles, timeout=60)


async def _flood(client: AsyncClient, model: str, cfg: SloConfig, rng: random.Random,
                 data: VariantData) -> None:
    """Poisson arrivals at ``cfg.rate``, each interactive with ``interactive_share``; the
    arrivals due are enqueued every tick as one call."""
    from inferq.errors import WouldMissSlo

    arrivals: list[float] = []
    t = rng.expovariate(cfg.rate)
    while t < cfg.seconds:
        arrivals.append(t)
        t += rng.expovariate(cfg.rate)
    classes = [rng.random() < cfg.interactive_share for _ in arrivals]
    t0, sent = time.perf_counter(), 0
    while sent < len(arrivals):
        elapsed = time.perf_counter() - t0
        due = sent
        while due < len(arrivals) and arrivals[due] <= elapsed:
            due += 1
        if due > sent:
            batch = [Sent(f"{'i' if classes[k] else 'r'}-{k}", classes[k])
                     for k in range(sent, due)]
            items = [{"prompt": s.id, "id": s.id,
                      "ttft_slo_ms": cfg.interactive_slo_ms if s.interactive
                      else cfg.relaxed_slo_ms} for s in batch]
            start = time.perf_counter()
            try:
                handles = await client.enqueue_many(items, model=model)
                refused: list[int] = []
            except WouldMissSlo as exc:
                handles, refused = exc.accepted, exc.refused
                data.refusal_call_ms.append((time.perf_counter() - start) * 1e3)
            by_id = {h.id: h for h in handles}
            for k, s in enumerate(batch):
                if k in refused:
                    data.refused.append(s)
                else:
                    s.predicted_ms = by_id[s.id].predicted_ms
                    data.sent.append(s)
            sent = due
        await asyncio.sleep(TICK_S)
    data.flood_s = time.perf_counter() - t0


def run_variant(cleanup: Cleanup, url: str, cfg: SloConfig, variant: str, trial: int,
                server: int | None, log_dir: Path) -> dict[str, Any]:
    from inferq.producer.aio import AsyncClient
    from inferq.protocol.keys import QueueKeys

    model = f"slo-{variant.replace('_', '-')}-t{trial}"
    order, admission = VARIANTS[variant]
    data = VariantData()

    async def prepare() -> None:
        async with AsyncClient(url) as client:
            await _set_policy(client, model, order, admission)

    asyncio.run(prepare())
    workers = spawn_workers(cleanup, url, [f"bench-{model}"], log_dir=log_dir,
                            model_arg=sleep_model(model, cfg.batch_ms, cfg.item_ms),
                            flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
    probe = queue_probe(server, [w.pid for w in workers])

    async def main() -> None:
        async with AsyncClient(url) as client:
            await _warm_up(client, model, cfg)
            await asyncio.sleep(1.5)  # the worker publishes its fit; producers re-read it
            probe.start()
            await _flood(client, model, cfg, random.Random(SEED + trial), data)

    asyncio.run(main())
    keys = QueueKeys.for_model("embed", model)
    client = redis.Redis.from_url(url)
    ids = [s.id for s in data.sent]
    # the backlog drains; what is not finished once the longest objective has passed since
    # the flood ended missed it
    deadline = time.monotonic() + cfg.relaxed_slo_ms / 1e3 + 2
    while time.monotonic() < deadline and client.zcard(keys.pending) + client.zcard(
            keys.inflight) > 0:
        check_alive(workers)
        time.sleep(0.2)
    cpu = probe.stop()
    results = {r.id: r for r in read_written(client, keys, ids)}
    for w in workers:
        stop_child(w.child)
    client.close()
    return summarize_variant(cfg, variant, data, results, cpu)


def summarize_variant(cfg: SloConfig, variant: str, data: VariantData,
                      results: Mapping[str, Any], cpu: Mapping[str, float | None]
                      ) -> dict[str, Any]:
    met = {s.id for s in data.sent
           if (r := results.get(s.id)) is not None and r.slo_met is True}
    # goodput over the span the met requests were served in: from the first enqueue to the
    # last result that met its objective (Redis clock), so a backlog drained after the
    # arrivals stopped counts over the time it took
    ends = [results[i].finished_ms for i in met if results[i].finished_ms is not None]
    starts = [r.enqueued_ms for r in results.values() if r.enqueued_ms is not None]
    span_s = (max(ends) - min(starts)) / 1e3 if ends and starts else data.flood_s
    interactive = [s for s in data.sent if s.interactive]
    interactive_all = interactive + [s for s in data.refused if s.interactive]
    i_met = sum(1 for s in interactive if s.id in met)
    lateness: list[float] = []
    ratios: dict[bool, list[float]] = {True: [], False: []}
    for s in data.sent:
        r = results.get(s.id)
        objective = cfg.interactive_slo_ms if s.interactive else cfg.relaxed_slo_ms
        if r is None or r.total_ms is None:
            lateness.append(float("inf"))
            continue
        lateness.append(r.total_ms / objective)
        if s.predicted_ms:
            ratios[s.interactive].append(r.total_ms / s.predicted_ms)
    out: dict[str, Any] = {
        "variant": variant, "sent": len(data.sent) + len(data.refused),
        "admitted": len(data.sent), "refused": len(data.refused),
        "refused_interactive": len(interactive_all) - len(interactive),
        "met": len(met), "goodput_per_s": len(met) / max(span_s, 1e-9), "span_s": span_s,
        "interactive_attainment": i_met / len(interactive) if interactive else None,
        "interactive_attainment_of_sent": (i_met / len(interactive_all) if interactive_all
                                           else None),
        "relaxed_met": len(met) - i_met,
        "unfinished": sum(1 for s in data.sent if s.id not in results),
        "worst_lateness": max(lateness, default=0.0),
        "late_over_2x": sum(1 for x in lateness if x > LATENESS_FACTOR),
        "refusal_call_ms": pcts(data.refusal_call_ms),
        "prediction_ratio": pcts(ratios[True] + ratios[False], (50, 90)),
        "prediction_ratio_interactive": pcts(ratios[True], (50, 90)),
        "prediction_ratio_relaxed": pcts(ratios[False], (50, 90)),
        "flood_s": data.flood_s, "other_load": cpu.get("other_load"),
    }
    worst = out["worst_lateness"]
    say(f"  {variant}: {out['sent']} sent, {out['refused']} refused, {out['met']} met their "
        f"objective ({out['goodput_per_s']:.1f}/s); interactive attainment "
        f"{(out['interactive_attainment'] or 0):.1%} of admitted; worst admitted "
        f"{worst:.2f}x its objective; actual/predicted p50 "
        f"{out['prediction_ratio']['p50'] or 0:.2f}")
    return out


def figures(trials: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for variant in VARIANTS:
        runs = [t[variant] for t in trials]
        s[variant] = {key: summarize_trials(runs, [key]) for key in (
            "sent", "admitted", "refused", "refused_interactive", "met", "goodput_per_s",
            "interactive_attainment", "interactive_attainment_of_sent", "relaxed_met",
            "unfinished", "worst_lateness", "late_over_2x", "span_s")}
        s[variant]["refusal_call_p99_ms"] = summarize_trials(runs, ["refusal_call_ms", "p99"])
        s[variant]["refusal_call_max_ms"] = summarize_trials(runs, ["refusal_call_ms", "max"])
        for q in ("p50", "p90"):
            for which in ("", "_interactive", "_relaxed"):
                s[variant][f"prediction{which}_{q}"] = summarize_trials(
                    runs, [f"prediction_ratio{which}", q])
    best, base = s["deadline_admission"], s["fifo"]
    gain = ((best["goodput_per_s"]["median"] or 0.0) / base["goodput_per_s"]["median"]
            if base["goodput_per_s"]["median"] else None)
    attain = best["interactive_attainment"]["median"]
    worst = best["worst_lateness"]["median"]
    refusal = best["refusal_call_max_ms"]["median"]
    def shown(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    target = {
        "goodput_gain": shown(gain, ".2f"), "goodput_verdict": verdict(gain, GOODPUT_FACTOR),
        "attainment": shown(attain, ".1%"),
        "attainment_verdict": verdict(attain, INTERACTIVE_ATTAINMENT),
        "worst_lateness": shown(worst, ".2f"),
        "lateness_verdict": verdict(worst, LATENESS_FACTOR, at_most=True),
        "refusal_ms": shown(refusal, ".1f"),
        "refusal_verdict": verdict(refusal, REFUSAL_MS, at_most=True),
        "goodput_factor": GOODPUT_FACTOR, "attainment_target": INTERACTIVE_ATTAINMENT,
        "lateness_factor": LATENESS_FACTOR, "refusal_target_ms": REFUSAL_MS}
    return {"summary": s, "trials": list(trials), "target": target,
            "noise": noise_of(v.get("other_load") for t in trials for v in t.values())}


class Slo(Scenario[SloConfig]):
    name = "slo"
    title = "latency objectives under 1.5x overload: FIFO, deadline order, admission"
    quick_help = "8 s of arrivals per variant (~1 min)"
    config = SloConfig
    trials = (2, 1)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_worker_arguments(parser, max_batch_size=8, max_wait_ms=5.0, batch_ms=50.0,
                             item_ms=5.0)

    def measure(self, run: Run[SloConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server(appendonly=False)
        say(f"{self.name} benchmark: 1 worker, full batch {cfg.full_batch_ms:.0f} ms -> "
            f"capacity {cfg.capacity:.0f} req/s; arrivals {cfg.rate:.0f}/s "
            f"({cfg.overload:g}x), {cfg.interactive_share:.0%} interactive "
            f"({cfg.interactive_slo_ms} ms) and the rest relaxed ({cfg.relaxed_slo_ms} ms); "
            f"{cfg.seconds:g} s per variant x {run.trials} trial(s)")
        trials = []
        for trial, order in run.rotations(list(VARIANTS)):
            trials.append({v: run_variant(run.cleanup, url, cfg, v, trial, server.pid,
                                          run.log_dir) for v in order})
        server.stop()
        if not trials:
            raise BenchmarkFailed("no trial ran")
        return figures(trials)

    def markdown(self, report: Mapping[str, Any]) -> str:
        return render("slo", report)


SCENARIO = Slo()
