"""Scenario ``batch``: online traffic and a batch job on one worker fleet. Interactive bursts
alternate with idle phases (llm-d-batch-gateway's protocol) while a batch of thousands of
lines runs through the gateway's Batches API; the method is in benchmarks/README.md.

Figures, side by side in one run: the online latency p50/p99 with the batch running divided
by the same schedule without it, and the batch's throughput during the idle phases divided by
the workers' measured capacity (a saturating flood of the same requests)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.framework import ByMode, Run, Scenario, flag, noise_of, render
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    CpuProbe,
    positive_float,
    positive_int,
    say,
    verdict,
)
from benchmarks.loadgen import open_loop, poisson
from benchmarks.stack import (
    SleepWindow,
    WorkerProc,
    add_worker_arguments,
    check_alive,
    gateway,
    load_str,
    pcts,
    served_s,
    spawn_workers,
    summarize_trials,
    wait_registered,
    window_flags,
)

P99_TARGET = 1.2
IDLE_TARGET = 0.9
SEED = 20261202
TOKEN = "bench-token"


@dataclass(frozen=True)
class BatchConfig(SleepWindow):
    workers: int = flag(positive_int, 1, "worker processes")
    cycles: int = flag(positive_int, ByMode(4, 2), "burst + idle cycles")
    burst_s: float = flag(positive_float, ByMode(5.0, 3.0),
                          "seconds of online traffic per cycle")
    idle_s: float = flag(positive_float, ByMode(5.0, 3.0),
                         "seconds without online traffic per cycle")
    online_load: float = flag(positive_float, 0.5, "online arrival rate in bursts / capacity")
    lines: int = flag(positive_int, ByMode(40_000, 12_000), "lines of the batch")

    @property
    def nominal_capacity(self) -> float:
        return self.workers * self.worker_capacity

    @property
    def schedule_s(self) -> float:
        return self.cycles * (self.burst_s + self.idle_s)


def _model_arg(model: str, cfg: BatchConfig) -> str:
    return f"{model}=builtin:sleep?batch_ms={cfg.batch_ms:g}&item_ms={cfg.item_ms:g}&vector=1"


class Gateway:
    """The gateway with a batch runner, its file store under the log folder."""

    def __init__(self, cleanup: Cleanup, url: str, log_dir: Path) -> None:
        from inferq.cli.batch_api import BatchApi

        self.child, port = gateway(cleanup, url, log_dir, env={
            "INFERQ_GATEWAY_TOKEN": TOKEN, "INFERQ_GATEWAY_REQUIRE_SERVED_MODEL": "false",
            "INFERQ_GATEWAY_FILE_STORE": str(log_dir / "batch-files"),
            "INFERQ_GATEWAY_BATCH_IDLE_S": "0.2"})
        self.api = BatchApi(f"http://127.0.0.1:{port}", TOKEN)


def lines_file(path: Path, model: str, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"line-{i}", "method": "POST",
                                "url": "/v1/embeddings",
                                "body": {"model": model, "input": f"batch line {i}"}}) + "\n")
    return path


async def capacity(url: str, model: str, n: int) -> float:
    """Requests/s of the workers on a saturating flood (Redis clock: first claim to last
    finish)."""
    from inferq.producer.aio import AsyncClient

    async with AsyncClient(url) as client:
        handles = await client.enqueue_many([f"flood {i}" for i in range(n)], model=model)
        results = [await h.result(timeout=300) for h in handles]
    return n / max(served_s(results), 1e-9)


def arrivals(cfg: BatchConfig, rate: float, rng: random.Random) -> list[float]:
    """Poisson arrivals during the bursts only (the idle phases have none)."""
    times: list[float] = []
    for c in range(cfg.cycles):
        start = c * (cfg.burst_s + cfg.idle_s)
        times += poisson(rate, rng, seconds=start + cfg.burst_s, start=start)
    return times


async def online(url: str, model: str, cfg: BatchConfig, times: Sequence[float],
                 workers: Sequence[WorkerProc], on_phase: Any = None) -> list[float]:
    """The online schedule; ``on_phase(k)`` at each phase boundary (k = 0..2*cycles)."""
    from inferq.producer.aio import AsyncClient

    async with AsyncClient(url) as client:
        async def call(i: int) -> None:
            handle = await client.enqueue(f"online {i}", model=model, priority=0)
            await handle.result(timeout=120)

        async def phases() -> None:
            t0 = time.perf_counter()
            for k in range(2 * cfg.cycles + 1):
                at = (k // 2) * (cfg.burst_s + cfg.idle_s) + (k % 2) * cfg.burst_s
                await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
                if on_phase is not None:
                    await asyncio.to_thread(on_phase, k)

        ticker = asyncio.create_task(phases())
        sent = await open_loop(call, times, lambda: check_alive(workers))
        await ticker
    if sent.errors:
        raise BenchmarkFailed(f"online requests failed: {sent.errors[:2]}")
    return [(done - at) * 1e3 for at, done, _ in filter(None, sent.records)]


def run_trial(run: Run[BatchConfig], url: str, server: int | None, trial: int,
              gateway: Gateway) -> dict[str, Any]:
    cfg = run.cfg
    model = f"batch-t{trial}"
    workers = spawn_workers(run.cleanup, url, [f"bench-batch-t{trial}-{i}"
                                               for i in range(cfg.workers)],
                            log_dir=run.log_dir, model_arg=_model_arg(model, cfg),
                            flags=window_flags(cfg.max_batch_size, cfg.max_wait_ms))
    wait_registered(url, workers)
    # The gateway's CPU is ours, not another tenant's load.
    probe = CpuProbe({"producer": None, "server": server,
                      "gateway": gateway.child.process.pid,
                      **{f"worker{i}": w.pid for i, w in enumerate(workers)}}, children=True)
    probe.start()
    cap = asyncio.run(capacity(url, model, max(500, int(cfg.nominal_capacity * 4))))
    rate = cfg.online_load * cap
    times = arrivals(cfg, rate, random.Random(SEED + trial))
    say(f"  capacity {cap:.0f} req/s (nominal {cfg.nominal_capacity:.0f}); online bursts at "
        f"{rate:.0f}/s: {len(times)} requests over {cfg.schedule_s:g} s")
    alone = asyncio.run(online(url, model, cfg, times, workers))

    path = lines_file(run.log_dir / f"batch-t{trial}.jsonl", model, cfg.lines)
    uploaded = gateway.api.upload(path)
    batch = gateway.api.create(uploaded["id"], "/v1/embeddings", "24h", None)
    # Let the feed learn the rate before the schedule starts.
    deadline = time.monotonic() + 60
    while (gateway.api.batch(batch["id"])["request_counts"]["completed"]
           < min(cfg.lines // 10, int(cap * 2))):
        if time.monotonic() > deadline:
            raise BenchmarkFailed("the batch did not start")
        time.sleep(0.1)
    marks: list[tuple[float, int]] = []

    def mark(_: int) -> None:
        counts = gateway.api.batch(batch["id"])["request_counts"]
        marks.append((time.perf_counter(), counts["completed"] + counts["failed"]))

    with_batch = asyncio.run(online(url, model, cfg, times, workers, on_phase=mark))
    final = gateway.api.batch(batch["id"])
    if final["status"] in ("completed", "finalizing"):
        raise BenchmarkFailed(f"the batch ended before the schedule did: raise --lines "
                              f"(now {cfg.lines})")
    cpu = probe.stop()
    gateway.api.call("POST", f"/v1/batches/{batch['id']}/cancel")
    lines_done = final["request_counts"]["completed"] + final["request_counts"]["failed"]
    idle_lines = sum(marks[k + 1][1] - marks[k][1] for k in range(1, len(marks) - 1, 2))
    idle_time = sum(marks[k + 1][0] - marks[k][0] for k in range(1, len(marks) - 1, 2))
    burst_lines = sum(marks[k + 1][1] - marks[k][1] for k in range(0, len(marks) - 1, 2))
    burst_time = sum(marks[k + 1][0] - marks[k][0] for k in range(0, len(marks) - 1, 2))
    a, w = pcts(alone), pcts(with_batch)
    out: dict[str, Any] = {
        "capacity_per_s": cap, "online_rate_per_s": rate, "online_count": len(times),
        "online_alone_ms": a, "online_with_batch_ms": w,
        "p50_ratio": (w["p50"] or 0) / (a["p50"] or 1),
        "p99_ratio": (w["p99"] or 0) / (a["p99"] or 1),
        "idle_batch_per_s": idle_lines / max(idle_time, 1e-9),
        "burst_batch_per_s": burst_lines / max(burst_time, 1e-9),
        "cpu_seconds": dict(cpu), "other_load": cpu.get("other_load"),
        "batch_lines_done": lines_done,
        # the gateway's CPU per batch line (ingestion, draining, the output parts)
        "gateway_cpu_us_per_line": (cpu.get("gateway") or 0.0) / max(lines_done, 1) * 1e6,
    }
    out["idle_over_capacity"] = out["idle_batch_per_s"] / cap
    say(f"  online p50/p99 alone {a['p50']:.0f}/{a['p99']:.0f} ms, with the batch "
        f"{w['p50']:.0f}/{w['p99']:.0f} ms (p99 x{out['p99_ratio']:.2f}); batch "
        f"{out['idle_batch_per_s']:.0f}/s in idle phases ({out['idle_over_capacity']:.2f} of "
        f"capacity), {out['burst_batch_per_s']:.0f}/s in bursts; other load "
        f"{load_str(out['other_load'])}")
    return out


def figures(trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for key in ("online_alone_ms", "online_with_batch_ms"):
        s[key] = {q: summarize_trials(trials, [key, q]) for q in ("p50", "p90", "p99")}
    for key in ("capacity_per_s", "online_rate_per_s", "p50_ratio", "p99_ratio",
                "idle_batch_per_s", "burst_batch_per_s", "idle_over_capacity", "other_load",
                "gateway_cpu_us_per_line"):
        s[key] = summarize_trials(trials, [key])
    p99, idle = s["p99_ratio"]["median"], s["idle_over_capacity"]["median"]
    return {"summary": s, "trials": list(trials),
            "noise": noise_of(t.get("other_load") for t in trials),
            "target": {"p99_ratio": p99, "p99_verdict": verdict(p99, P99_TARGET, at_most=True),
                       "idle_over_capacity": idle,
                       "idle_verdict": verdict(idle, IDLE_TARGET)}}


def results_markdown(r: Mapping[str, Any]) -> str:
    return render("batch", r, p99_target=P99_TARGET, idle_target=IDLE_TARGET)


class Batch(Scenario[BatchConfig]):
    name = "batch"
    title = "online bursts and a batch job on one fleet"
    quick_help = "2 cycles of 3 s bursts and 3 s idle (~1 min)"
    config = BatchConfig
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_worker_arguments(parser, max_batch_size=32, max_wait_ms=5.0, batch_ms=40.0,
                             item_ms=0.5)

    def measure(self, run: Run[BatchConfig]) -> dict[str, Any]:
        cfg = run.cfg
        server, url = run.server()
        say(f"{self.name} benchmark: {cfg.workers} worker(s), full batch "
            f"{cfg.full_batch_ms:.0f} ms; {cfg.cycles} x ({cfg.burst_s:g} s burst + "
            f"{cfg.idle_s:g} s idle), a {cfg.lines}-line batch; {run.trials} trial(s)")
        gateway = Gateway(run.cleanup, url, run.log_dir)
        return figures([run_trial(run, url, server.pid, trial, gateway)
                        for trial in run.each_trial()])


SCENARIO = Batch()
