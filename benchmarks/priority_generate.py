"""Scenario ``priority-generate``: high-priority chats through a low-priority flood of
generations that fills every slot, with preemption on and off and the chats alone; the method is
in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks import corpus
from benchmarks.framework import ByMode, Run, Scenario, flag, render, render_rows
from benchmarks.harness import (
    BenchmarkFailed,
    fmt_number,
    percentiles,
    positive_float,
    positive_int,
    ratio,
    say,
    stop_child,
    verdict,
)
from benchmarks.loadgen import open_loop, poisson
from benchmarks.models import generation_source
from benchmarks.stack import WorkerProc, median_at, pipelined, spawn_worker, wait_registered
from inferq.protocol.keys import QueueKeys

VARIANTS = ("alone", "preempt", "no-preempt")
TTFT_TARGET = 3.0
FLOOD_TARGET = 0.9
FLOOD_PRIORITY, CHAT_PRIORITY = -10, 50
FEED_S = 0.2


@dataclass(frozen=True)
class PriorityGenerateConfig:
    model: str = flag(default=ByMode("smollm2", "tiny"), choices=("tiny", "smollm2"))
    slots: int = flag(positive_int, ByMode(8, 4))
    flood_tokens: int = flag(positive_int, ByMode(400, 300))
    chat_tokens: int = flag(positive_int, 16)
    rate: float = flag(positive_float, ByMode(0.5, 4.0), "chats per second (Poisson)")
    seconds: float = flag(positive_float, ByMode(60.0, 5.0), "how long chats arrive")
    seed: int = flag(int, 7)
    #: The worker's ``--engine``: transformers (inferq's loop) or vllm (vLLM's engine, started
    #: with ``enforce_eager``: no minutes of compilation per worker).
    engine: str = flag(default="transformers", choices=("transformers", "vllm"), help="the "
                       "workers' --engine (vllm: needs vLLM installed, and --model smollm2)")



def _engine_flags(engine: str) -> list[str]:
    return ["--engine", "vllm", "--vllm-option", "enforce_eager=true"] if engine == "vllm" else []


def _worker(run: Run[PriorityGenerateConfig], url: str, variant: str, trial: int,
            source: str) -> WorkerProc:
    cfg = run.cfg
    queue_model = f"pg-{variant}-t{trial}"
    flags = ["--device", "cpu", "--max-slots", str(cfg.slots),
             *(["--max-preemptions", "0"] if variant == "no-preempt" else []),
             *_engine_flags(cfg.engine)]
    return spawn_worker(run.cleanup, url, model_arg=f"{queue_model}={source}",
                        worker_id=f"bench-{queue_model}", log_dir=run.log_dir, flags=flags,
                        log_level="INFO", task="generate")


def _streamed_tokens(r: redis.Redis, keys: QueueKeys, ids: Sequence[str]) -> int:
    streams = pipelined(r, ids, lambda pipe, i: pipe.xrange(keys.stream(i)))
    return sum(len(fields.get(b"k", b"").split()) for entries in streams for _, fields in entries)


async def _variant(url: str, worker: WorkerProc, variant: str, cfg: PriorityGenerateConfig,
                   prompts: Sequence[str]) -> dict[str, Any]:
    import inferq

    keys = worker.keys
    arrivals = poisson(cfg.rate, random.Random(cfg.seed), seconds=cfg.seconds)
    flood_ids: list[str] = []
    wait_registered(url, [worker])
    r = redis.Redis.from_url(url)
    async with inferq.AsyncClient(url) as client:
        warm = await client.enqueue("warm up", model=worker.model, task="generate",
                                    params={"max_new_tokens": 4})
        await warm.result(timeout=600)

        async def flood(count: int) -> None:
            handles = await client.enqueue_many(
                [{"prompt": prompts[(len(flood_ids) + i) % len(prompts)],
                  "priority": FLOOD_PRIORITY,
                  "params": {"max_new_tokens": cfg.flood_tokens, "ignore_eos": True}}
                 for i in range(count)], model=worker.model, task="generate")
            flood_ids.extend(h.id for h in handles)

        async def feed() -> None:  # keep every slot busy and the flood queued behind them
            while True:
                await flood(max(0, cfg.slots - int(r.zcard(keys.pending))))
                await asyncio.sleep(FEED_S)

        async def chat(i: int) -> float:
            sent = time.monotonic()
            handle = await client.enqueue(f"question {i}: {prompts[i % len(prompts)][:80]}",
                                          model=worker.model, task="generate",
                                          priority=CHAT_PRIORITY,
                                          params={"max_new_tokens": cfg.chat_tokens,
                                                  "ignore_eos": True})
            first = None
            async for item in handle.stream(timeout=3600):
                if first is None and isinstance(item, str) and item:
                    first = time.monotonic() - sent
                if isinstance(item, inferq.Result) and not item.ok:
                    raise BenchmarkFailed(f"chat {i} failed: {item.error}")
            return (first if first is not None else time.monotonic() - sent) * 1e3

        feeder = None
        if variant != "alone":
            await flood(2 * cfg.slots)
            feeder = asyncio.create_task(feed())
            deadline = time.monotonic() + 600
            while sum(r.xlen(keys.stream(i)) > 0 for i in flood_ids) < cfg.slots:
                if time.monotonic() > deadline:
                    raise BenchmarkFailed("the flood never filled the slots")
                await asyncio.sleep(0.05)
        before = _streamed_tokens(r, keys, flood_ids)
        start = time.monotonic()
        ttfts = [ms for _, _, ms in filter(None, (await open_loop(chat, arrivals)).records)]
        span = time.monotonic() - start
        flood_tokens = _streamed_tokens(r, keys, flood_ids) - before
        if feeder is not None:
            feeder.cancel()
        for request_id in flood_ids:  # the rest of the flood leaves at the next step
            await client.handle(request_id, model=worker.model, task="generate").cancel()
    stats = {k.decode(): v.decode() for k, v in r.hgetall(keys.window(worker.worker_id)).items()}
    r.close()
    return {"chats": len(ttfts), "ttft_ms": percentiles(ttfts, (50, 99)),
            "flood_tokens": flood_tokens, "span_s": round(span, 3),
            "flood_tokens_per_s": flood_tokens / span if variant != "alone" else None,
            "preemptions": int(stats.get("preemptions", 0))}


def _ratios(variants: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, float | None]:
    def med(variant: str, *path: str) -> float | None:
        return median_at(variants.get(variant, []), *path)

    return {
        "ttft_p99_preempt_vs_alone": ratio(med("preempt", "ttft_ms", "p99"),
                                           med("alone", "ttft_ms", "p99")),
        "ttft_p50_preempt_vs_alone": ratio(med("preempt", "ttft_ms", "p50"),
                                           med("alone", "ttft_ms", "p50")),
        "ttft_p99_no_preempt_vs_alone": ratio(med("no-preempt", "ttft_ms", "p99"),
                                              med("alone", "ttft_ms", "p99")),
        "flood_preempt_vs_no_preempt": ratio(med("preempt", "flood_tokens_per_s"),
                                             med("no-preempt", "flood_tokens_per_s")),
    }


def results_markdown(r: Mapping[str, Any]) -> str:
    ratios = r["ratios"]
    p99, flood = ratios["ttft_p99_preempt_vs_alone"], ratios["flood_preempt_vs_no_preempt"]
    return render(
        "priority-generate", r, flood_priority=FLOOD_PRIORITY, chat_priority=CHAT_PRIORITY,
        rows=render_rows("priority-generate.row", (
            {**t, "variant": variant, "trial": i + 1}
            for variant in VARIANTS for i, t in enumerate(r["variants"][variant]))),
        p99=fmt_number(p99, 2), p50=fmt_number(ratios["ttft_p50_preempt_vs_alone"], 2),
        no_preempt=fmt_number(ratios["ttft_p99_no_preempt_vs_alone"], 1),
        ttft_target=TTFT_TARGET, ttft_verdict=verdict(p99, TTFT_TARGET, at_most=True),
        flood=fmt_number(flood, 2), flood_target=FLOOD_TARGET,
        flood_verdict=verdict(flood, FLOOD_TARGET),
        engine_flags=" ".join(["", *_engine_flags(r["config"].get("engine", "transformers"))]))


class PriorityGenerate(Scenario[PriorityGenerateConfig]):
    name = "priority-generate"
    title = "high-priority chats through a low-priority flood of generations (preemption)"
    quick_help = "the tiny Llama, 4 slots, 5 s of chats, one trial (~1 min)"
    config = PriorityGenerateConfig
    trials = (2, 1)
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[PriorityGenerateConfig]) -> dict[str, Any]:
        cfg = run.cfg
        source = generation_source(cfg.model, run.out)
        _server, url = run.server()
        prompts = corpus.sentences(64, seed=cfg.seed)
        variants: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for trial, order in run.rotations(VARIANTS):
            for variant in order:
                say(f"  {variant}")
                worker = _worker(run, url, variant, trial, source)
                try:
                    figures = asyncio.run(_variant(url, worker, variant, cfg, prompts))
                finally:
                    stop_child(worker.child)
                variants[variant].append(figures)
                say(f"  chat TTFT p50 {figures['ttft_ms']['p50']:.0f} ms, p99 "
                    f"{figures['ttft_ms']['p99']:.0f} ms; flood "
                    f"{fmt_number(figures['flood_tokens_per_s'], 1)} tokens/s; "
                    f"{figures['preemptions']} preemptions")
        return {"variants": variants, "ratios": _ratios(variants)}

    def save(self, report: dict[str, Any], out: Path, results_md: Path | None) -> str:
        """A run with ``--engine vllm`` has its own JSON and RESULTS.md section."""
        if report["config"].get("engine") == "vllm":
            return Scenario.save(_WITH_VLLM, report, out, results_md)
        return super().save(report, out, results_md)


class _PriorityGenerateVllm(PriorityGenerate):
    name = "priority-generate-vllm"
    title = ("high-priority chats through a low-priority flood (worker-side preemption on "
             "vLLM)")


_WITH_VLLM = _PriorityGenerateVllm()
SCENARIO = PriorityGenerate()
