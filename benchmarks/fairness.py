"""Scenario ``fairness``: tenants sharing one queue inside a priority band, side by side in one
run: weights 3:2:1 under floods with a light tenant beside them, 10x longer prompts at equal
weights, and one tenant alone against no tenant (throughput and Redis commands per request);
the method is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from benchmarks.framework import ByMode, Run, Scenario, flag, render, render_rows, switch
from benchmarks.harness import Cleanup, positive_float, positive_int, say, stop_child, verdict
from benchmarks.loadgen import open_loop, poisson
from benchmarks.stack import (
    SleepWindow,
    WorkerProc,
    add_worker_arguments,
    check_alive,
    fill_and_drain,
    paused,
    pcts,
    read_written,
    sleep_model,
    spawn_worker,
    wait_registered,
    window_flags,
)

if TYPE_CHECKING:
    pass

SEED = 20261202
SHARE_TOLERANCE = 0.05  # ±5 points of the ideal share
THROUGHPUT_TOLERANCE = 0.03
WAIT_FACTOR = 2.0
CHUNK = 500
WEIGHTS = {"a": 3, "b": 2, "c": 1}
#: Each tenant's ideal share of the cost: with WEIGHTS, and with equal weights.
IDEAL = {t: w / sum(WEIGHTS.values()) for t, w in WEIGHTS.items()}
EQUAL = {t: 1 / len(WEIGHTS) for t in WEIGHTS}


@dataclass(frozen=True)
class FairnessConfig(SleepWindow):
    seconds: float = flag(positive_float, ByMode(60.0, 8.0),
                          "how long the worker serves each flood")
    overload: float = flag(positive_float, 1.2, "each flooding tenant's backlog / what the "
                           "worker serves in --seconds")
    light_share: float = flag(positive_float, 0.05, "the light tenant's arrival rate / capacity")
    prompt_bytes: int = flag(positive_int, 40, "prompt size (cost = bytes / 4; tenant a's long "
                             "prompts are 10x)")
    alone_requests: int = flag(positive_int, ByMode(20_000, 5_000), "requests per pass of the "
                               "one-tenant comparison (echo model)")
    generate: bool = switch("skip the generate worker part (tiny random Llama)",
                            name="--no-generate")
    generate_backlog: int = flag(positive_int, ByMode(3000, 1000),
                                 "requests each tenant queues for the generate worker")
    generate_seconds: float = flag(positive_float, ByMode(60.0, 20.0),
                                   "how long the generate worker serves")
    alone_trials: int = flag(positive_int, ByMode(5, 3), "passes per mode of that comparison")

    @property
    def capacity(self) -> float:
        """Requests/s one worker serves running full batches back to back."""
        return self.worker_capacity

    @property
    def backlog(self) -> int:
        """Requests each flooding tenant queues: ``overload`` x what the worker serves in
        ``seconds`` (each alone would keep it busy past the end)."""
        return int(self.overload * self.capacity * self.seconds)


def _configure(url: str, queue: str, weights: Mapping[str, int]) -> None:
    from inferq.protocol.keys import QueueKeys
    from inferq.protocol.settings import SET_TENANTS, tenants_call

    task, _, model = queue.partition(":")
    keys, args = tenants_call(QueueKeys.for_model(task, model).config, weights=dict(weights))
    client = redis.Redis.from_url(url)
    client.register_script(SET_TENANTS)(keys=keys, args=args)
    client.close()


def _text(n: int, tag: str) -> str:
    return (tag + "-" + "x" * n)[:n]


def flood(cleanup: Cleanup, url: str, cfg: FairnessConfig, worker: WorkerProc,
          prompts: Mapping[str, str], light: bool, server: int | None,
          params: Mapping[str, Any] | None = None, backlog: int | None = None
          ) -> dict[str, Any]:
    """With the worker paused, each tenant of ``prompts`` queues ``cfg.backlog`` requests (in
    interleaved chunks); then the worker runs for ``cfg.seconds`` while, with ``light``, a
    light tenant sends Poisson arrivals at ``light_share`` of capacity, each awaited. Served
    cost and requests per tenant are read from the results written before the worker stops."""
    from inferq.producer.aio import AsyncClient
    from inferq.protocol.cost import estimate

    rng = random.Random(SEED)
    backlog = cfg.backlog if backlog is None else backlog
    ids: dict[str, list[str]] = {t: [] for t in prompts}
    light_waits: list[float] = []

    async def fill() -> None:
        async with AsyncClient(url) as producer:
            for start in range(0, backlog, CHUNK):
                for tenant, prompt in prompts.items():
                    n = min(CHUNK, backlog - start)
                    handles = await producer.enqueue_many(
                        [prompt] * n, model=worker.model, task=worker.task, tenant=tenant,
                        params=dict(params or {}))
                    ids[tenant] += [h.id for h in handles]

    async def trickle() -> None:
        async with AsyncClient(url) as producer:
            async def one(i: int) -> None:
                handle = await producer.enqueue(_text(cfg.prompt_bytes, f"light{i}"),
                                                model=worker.model, tenant="light")
                result = await handle.result(timeout=cfg.seconds + 60)
                if result.queue_wait_ms is not None:
                    light_waits.append(result.queue_wait_ms)
            await open_loop(one, [0.0, *poisson(cfg.light_share * cfg.capacity, rng,
                                                seconds=cfg.seconds - 1.0)])

    client = redis.Redis.from_url(url)
    with paused(cleanup, [worker.pid]) as resume:
        asyncio.run(fill())
        resume([worker.pid])
        t0 = time.perf_counter()
        if light:
            asyncio.run(trickle())
        while time.perf_counter() - t0 < cfg.seconds:
            check_alive([worker])
            time.sleep(0.1)
    stop_child(worker.child)
    served: dict[str, dict[str, float]] = {}
    for tenant, tenant_ids in ids.items():
        results = read_written(client, worker.keys, tenant_ids)
        cost = estimate(worker.task, len(prompts[tenant].encode()), params or {}, None)
        served[tenant] = {"requests": len(results), "cost": len(results) * cost}
    client.close()
    total_cost = sum(s["cost"] for s in served.values()) or 1
    total_requests = sum(s["requests"] for s in served.values()) or 1
    for s in served.values():
        s["cost_share"] = s["cost"] / total_cost
        s["request_share"] = s["requests"] / total_requests
    say("  served " + ", ".join(f"{t}: {s['requests']:.0f} requests, {s['cost_share']:.1%} of "
                                f"the cost" for t, s in served.items()))
    out: dict[str, Any] = {"served": served}
    if light:
        out["light_wait_ms"] = pcts(light_waits)
        out["light_requests"] = len(light_waits)
        say(f"  light tenant: {len(light_waits)} requests, queue wait p50/p99 "
            f"{out['light_wait_ms']['p50']:.0f}/{out['light_wait_ms']['p99']:.0f} ms")
    return out


def alone(cleanup: Cleanup, url: str, cfg: FairnessConfig, worker: WorkerProc,
          server: int | None) -> dict[str, Any]:
    """The same backlog drained by one echo worker without a tenant and with one tenant,
    alternating; requests/s (Redis clock) and Redis commands per request, fill and drain."""
    prompts = [_text(cfg.prompt_bytes, f"p{i}") for i in range(cfg.alone_requests)]
    runs: dict[str, list[dict[str, float]]] = {"none": [], "one": []}
    for trial in range(cfg.alone_trials):
        for mode in (("none", "one") if trial % 2 == 0 else ("one", "none")):
            drained = fill_and_drain(cleanup, url, worker.model, prompts, chunk=CHUNK,
                                     paused_workers=[worker], active=[worker], server=server,
                                     timeout_s=300, tenant=None if mode == "none" else "solo")
            runs[mode].append({
                "throughput": drained.throughput,
                "fill_commands": drained.redis_fill.commands_per_request,
                "fill_client_commands": drained.redis_fill.client_commands_per_request,
                "drain_commands": drained.redis_drain.commands_per_request,
                "drain_client_commands": drained.redis_drain.client_commands_per_request})
            say(f"  {mode} tenant: {drained.throughput:.0f} req/s, Redis commands/request "
                f"fill {drained.redis_fill.commands_per_request:.2f} + drain "
                f"{drained.redis_drain.commands_per_request:.2f}")

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    keys = ("throughput", "fill_commands", "fill_client_commands", "drain_commands",
            "drain_client_commands")
    out: dict[str, Any] = {m: {k: median(m, k) for k in keys} for m in runs}
    out["runs"] = runs
    out["throughput_ratio"] = out["one"]["throughput"] / out["none"]["throughput"]
    return out


def share_error(part: Mapping[str, Any], ideal: Mapping[str, float]) -> float:
    """The largest distance of a tenant's share of the served cost from its ideal share."""
    return max(abs(part["served"][t]["cost_share"] - share) for t, share in ideal.items())


def figures(cfg: FairnessConfig, weights: Mapping[str, Any], tokens: Mapping[str, Any],
            solo: Mapping[str, Any], generate: Mapping[str, Any] | None) -> dict[str, Any]:
    weight_err, token_err = share_error(weights, IDEAL), share_error(tokens, EQUAL)
    reference = cfg.max_wait_ms + cfg.full_batch_ms
    light_p99 = weights["light_wait_ms"]["p99"]
    commands_delta = (solo["one"]["fill_commands"] + solo["one"]["drain_commands"]
                      - solo["none"]["fill_commands"] - solo["none"]["drain_commands"])
    # how far apart the passes of one mode are (max - min) / median: the noise the 3 % target
    # must be read against
    spread = max((max(v) - min(v)) / statistics.median(v) for v in (
        [run["throughput"] for run in solo["runs"][mode]] for mode in ("none", "one")))
    generate_err = None if generate is None else share_error(generate, IDEAL)
    return {
        "weights": weights, "tokens": tokens, "alone": solo, "generate": generate,
        "target": {
            "generate_share_error": generate_err,
            "generate_verdict": verdict(generate_err, SHARE_TOLERANCE, at_most=True),
            "weight_share_error": weight_err,
            "weight_verdict": verdict(weight_err, SHARE_TOLERANCE, at_most=True),
            "token_share_error": token_err,
            "token_verdict": verdict(token_err, SHARE_TOLERANCE, at_most=True),
            "light_reference_ms": reference,
            "light_p99_over_reference": None if light_p99 is None else light_p99 / reference,
            "light_verdict": verdict(None if light_p99 is None else light_p99 / reference,
                                     WAIT_FACTOR, at_most=True),
            "throughput_loss": 1 - solo["throughput_ratio"],
            "throughput_spread": spread,
            "throughput_verdict": verdict(1 - solo["throughput_ratio"], THROUGHPUT_TOLERANCE,
                                          at_most=True) if spread <= 2 * THROUGHPUT_TOLERANCE
            else f"INCONCLUSIVE: passes of one mode vary by {spread:.0%}",
            "commands_delta": commands_delta}}


def results_markdown(r: Mapping[str, Any]) -> str:
    parts = [("weights 3:2:1", r["weights"], IDEAL),
             ("equal weights, a's prompts 10x longer", r["tokens"], EQUAL),
             *([("generate worker (tiny Llama), weights 3:2:1", r["generate"], IDEAL)]
               if r.get("generate") else [])]
    a = r["alone"]
    generate = (render("fairness.generate", r) if r["target"].get("generate_share_error")
                is not None else "")
    return render(
        "fairness", r, generate_row=generate, wait_factor=WAIT_FACTOR,
        share_rows=render_rows("fairness.share", (
            {**s, "run": label, "tenant": tenant, "ideal": ideal[tenant]}
            for label, part, ideal in parts for tenant, s in part["served"].items())),
        alone_rows=render_rows("fairness.alone", (
            {**a[mode], "mode": mode, "low": min(t["throughput"] for t in a["runs"][mode]),
             "high": max(t["throughput"] for t in a["runs"][mode])} for mode in ("none", "one"))))


class Fairness(Scenario[FairnessConfig]):
    name = "fairness"
    title = "fair shares between tenants inside a priority band"
    quick_help = "8 s floods, 5,000 requests alone x 3 (~2 min)"
    config = FairnessConfig
    trials = None
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_worker_arguments(parser, max_batch_size=32, max_wait_ms=10.0, batch_ms=40.0,
                             item_ms=0.5)

    def measure(self, run: Run[FairnessConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        say(f"{self.name} benchmark: sleep model, full batch {cfg.full_batch_ms:.0f} ms -> "
            f"capacity {cfg.capacity:.0f} req/s; each flooding tenant queues {cfg.backlog} "
            f"requests; {cfg.seconds:g} s per flood")
        flags = window_flags(cfg.max_batch_size, cfg.max_wait_ms)
        model = sleep_model("fair-w", cfg.batch_ms, cfg.item_ms)
        short = _text(cfg.prompt_bytes, "s")
        _configure(url, "embed:fair-w", {**WEIGHTS, "light": 1})
        w1 = spawn_worker(run.cleanup, url, model_arg=model, worker_id="fair-w",
                          log_dir=run.log_dir, flags=flags)
        wait_registered(url, [w1])
        say("weights 3:2:1, each flooding, and a light tenant")
        weights = flood(run.cleanup, url, cfg, w1, {t: short for t in WEIGHTS}, True,
                        server.pid)
        w2 = spawn_worker(run.cleanup, url, worker_id="fair-t", log_dir=run.log_dir,
                          flags=flags, model_arg=sleep_model("fair-t", cfg.batch_ms,
                                                             cfg.item_ms))
        wait_registered(url, [w2])
        say("equal weights, tenant a's prompts 10x longer")
        tokens = flood(run.cleanup, url, cfg, w2,
                       {"a": _text(10 * cfg.prompt_bytes, "l"), "b": short, "c": short}, False,
                       server.pid)
        w3 = spawn_worker(run.cleanup, url, model_arg="fair-echo=builtin:echo",
                          worker_id="fair-echo", log_dir=run.log_dir,
                          flags=window_flags(256, 1.0))
        wait_registered(url, [w3])
        say("one tenant alone vs no tenant (echo model)")
        solo = alone(run.cleanup, url, cfg, w3, server.pid)
        stop_child(w3.child)
        generate = None
        if cfg.generate:
            generate = self.generate(run, url, server.pid)
        server.stop()
        return figures(cfg, weights, tokens, solo, generate)

    def generate(self, run: Run[FairnessConfig], url: str, server: int | None
                 ) -> dict[str, Any]:
        """Weights 3:2:1 through a ``generate`` worker on the tiny random Llama (continuous
        batching, 8 slots): cost = prompt tokens + max_new_tokens."""
        from benchmarks.models import generation_source

        cfg = run.cfg
        source = generation_source("tiny", run.out)
        _configure(url, "generate:fair-g", WEIGHTS)
        worker = spawn_worker(run.cleanup, url, model_arg=f"fair-g={source}",
                              worker_id="fair-g", log_dir=run.log_dir, task="generate",
                              flags=["--device", "cpu", "--max-slots", "8"])
        wait_registered(url, [worker])
        import inferq

        with inferq.Client(url) as client:  # warm: the engine process has loaded the weights
            client.enqueue("warm up", model=worker.model, task="generate",
                           params={"max_new_tokens": 2}).result(timeout=300)
        say("weights 3:2:1 through a generate worker (tiny Llama)")
        prompt = _text(cfg.prompt_bytes, "g")
        return flood(run.cleanup, url, dataclasses.replace(cfg, seconds=cfg.generate_seconds),
                     worker, {t: prompt for t in WEIGHTS}, False, server,
                     params={"max_new_tokens": 16, "ignore_eos": True},
                     backlog=cfg.generate_backlog)


SCENARIO = Fairness()
