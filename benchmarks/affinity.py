"""Scenario ``affinity``: cache-affinity claims. Two generate workers share a queue whose
requests start with one of K long system prompts, plus multi-turn sessions; Poisson arrivals;
short outputs, so that prefill dominates. Variants, side by side: affinity ``off``, ``prefix``
and ``session`` (two workers, prefix caches on), and one worker with its prefix cache on and
off (``cache``, ``no-cache``: what the cache alone is worth). The method is in
benchmarks/README.md; the feature in docs/guides/cache-affinity.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks import corpus
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    flag,
    render,
    render_rows,
)
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
from benchmarks.stack import WorkerProc, median_at, spawn_worker, wait_registered

#: (variant, workers, affinity, prefix cache on)
VARIANTS = {"off": (2, "off", True), "prefix": (2, "prefix", True),
            "session": (2, "session", True), "cache": (1, "off", True),
            "no-cache": (1, "off", False)}
TTFT_TARGET, TPS_TARGET, HIT_TARGET = 2.0, 1.3, 0.8


@dataclass(frozen=True)
class AffinityConfig:
    model: str = flag(default=ByMode("smollm2", "tiny"), choices=("tiny", "smollm2"))
    prompts: int = flag(positive_int, ByMode(4, 4), "shared system prompts (K)")
    prompt_words: int = flag(positive_int, ByMode(750, 60),
                             "words per system prompt (750: about 1,000 SmolLM2 tokens)")
    sessions: int = flag(positive_int, ByMode(4, 4), "multi-turn sessions")
    turns: int = flag(positive_int, ByMode(4, 3), "turns per session")
    session_share: float = flag(positive_float, 0.3, "share of arrivals that are turns")
    rate: float = flag(positive_float, ByMode(0.6, 6.0), "requests per second (Poisson)")
    seconds: float = flag(positive_float, ByMode(60.0, 6.0), "how long requests arrive")
    max_new_tokens: int = flag(positive_int, 8)
    slots: int = flag(positive_int, 4, "--max-slots of each worker")
    prefix_cache_mb: float = flag(positive_float, ByMode(140.0, 0.4),
                                  "--prefix-cache-mb of each worker: about half the system "
                                  "prompts fit (SmolLM2: 45 KiB per token)")
    torch_threads: int = flag(positive_int, 1, "--torch-threads of each worker")
    max_wait_ms: int = flag(positive_int, 2000, "--affinity-max-wait-ms")
    seed: int = flag(int, 11)


@dataclass(frozen=True)
class Request:
    messages: list[dict[str, str]]
    session: str | None
    #: For a turn: the session and turn index (the turn waits for the one before).
    turn: tuple[int, int] | None = None


def workload(cfg: AffinityConfig, arrivals: int) -> list[Request]:
    rng = random.Random(cfg.seed)
    words = corpus.sentences(cfg.prompts * cfg.prompt_words // 8 + 8, seed=cfg.seed,
                             min_words=8, max_words=8)
    systems = [" ".join(words[i::cfg.prompts])[: cfg.prompt_words * 7]
               for i in range(cfg.prompts)]
    questions = corpus.sentences(64, seed=cfg.seed + 1, min_words=6, max_words=12)
    turns_left = {s: 0 for s in range(cfg.sessions)}
    history: dict[int, list[dict[str, str]]] = {}
    out: list[Request] = []
    for _ in range(arrivals):
        open_sessions = [s for s, t in turns_left.items() if t < cfg.turns]
        if open_sessions and rng.random() < cfg.session_share:
            s = rng.choice(open_sessions)
            messages = history.get(s) or [{"role": "system",
                                           "content": systems[s % cfg.prompts]}]
            messages = [*messages, {"role": "user", "content": rng.choice(questions)}]
            out.append(Request(messages, f"session-{s}", (s, turns_left[s])))
            # the next turn extends this one (its answer stands in as a fixed text)
            history[s] = [*messages, {"role": "assistant", "content": "Noted, go on."}]
            turns_left[s] += 1
        else:
            out.append(Request([{"role": "system", "content": rng.choice(systems)},
                                {"role": "user", "content": rng.choice(questions)}], None))
    return out


def _workers(run: Run[AffinityConfig], url: str, variant: str, trial: int,
             source: str) -> list[WorkerProc]:
    count, _, cache = VARIANTS[variant]
    cfg = run.cfg
    queue_model = f"aff-{variant}-t{trial}"
    flags = ["--device", "cpu", "--max-slots", str(cfg.slots), "--torch-threads",
             str(cfg.torch_threads), "--prefix-cache-mb",
             str(cfg.prefix_cache_mb) if cache else "0"]
    return [spawn_worker(run.cleanup, url, model_arg=f"{queue_model}={source}",
                         worker_id=f"bench-{queue_model}-{i}", log_dir=run.log_dir,
                         flags=flags, log_level="INFO", task="generate")
            for i in range(count)]


async def _variant(url: str, workers: list[WorkerProc], variant: str, cfg: AffinityConfig,
                   requests: Sequence[Request], arrivals: Sequence[float]) -> dict[str, Any]:
    import inferq

    keys = workers[0].keys
    r = redis.Redis.from_url(url)
    r.hset(keys.config, mapping={"affinity": VARIANTS[variant][1],
                                 "affinity_max_wait_ms": cfg.max_wait_ms})
    wait_registered(url, workers)
    params = {"max_new_tokens": cfg.max_new_tokens, "ignore_eos": True}
    async with inferq.AsyncClient(url) as client:
        warm = await client.enqueue_many(["warm up"] * len(workers), model=workers[0].model,
                                         task="generate", params={"max_new_tokens": 2})
        for h in warm:
            await h.result(timeout=900)
        done = {(s, t): asyncio.Event() for s in range(cfg.sessions) for t in range(cfg.turns)}
        tokens = 0

        async def call(i: int) -> float:
            nonlocal tokens
            req = requests[i]
            if req.turn is not None and req.turn[1] > 0:  # a turn follows the one before
                await done[(req.turn[0], req.turn[1] - 1)].wait()
            sent = time.monotonic()
            handle = await client.enqueue(model=workers[0].model, task="generate",
                                          messages=req.messages, session=req.session,
                                          params=params)
            first = None
            async for item in handle.stream(timeout=3600):
                if first is None and isinstance(item, str) and item:
                    first = time.monotonic() - sent
                if isinstance(item, inferq.Result):
                    if not item.ok:
                        raise BenchmarkFailed(f"request {i} failed: {item.error}")
                    tokens += item.usage.completion_tokens if item.usage else 0
            if req.turn is not None:
                done[req.turn].set()
            return (first if first is not None else time.monotonic() - sent) * 1e3

        start = time.monotonic()
        result = await open_loop(call, arrivals)
        span = time.monotonic() - start
    if result.errors:
        raise BenchmarkFailed(f"{variant}: {result.errors[0]}")
    ttfts = [ms for _, _, ms in filter(None, result.records)]
    await asyncio.sleep(2.5)  # the workers' stats hashes, published every second or so
    prompt = reused = claimed = preferred = 0
    for w in workers:
        fields = {k.decode(): v.decode()
                  for k, v in r.hgetall(keys.window(w.worker_id)).items()}
        prompt += int(fields.get("prefix_prompt_tokens", 0))
        reused += int(fields.get("prefix_reused_tokens", 0))
        claimed += int(fields.get("claimed", 0))
        preferred += int(fields.get("affinity_claimed", 0))
    r.close()
    return {"requests": len(ttfts), "ttft_ms": percentiles(ttfts, (50, 99)),
            "tokens_per_s": tokens / span, "span_s": round(span, 2),
            "hit_rate": reused / prompt if prompt else None, "prompt_tokens": prompt,
            "reused_tokens": reused, "affinity_share": preferred / claimed if claimed else None}


def _ratios(variants: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, float | None]:
    def med(variant: str, *path: str) -> float | None:
        return median_at(variants.get(variant, []), *path)

    return {
        "ttft_p50_off_vs_prefix": ratio(med("off", "ttft_ms", "p50"),
                                        med("prefix", "ttft_ms", "p50")),
        "ttft_p99_off_vs_prefix": ratio(med("off", "ttft_ms", "p99"),
                                        med("prefix", "ttft_ms", "p99")),
        "tps_prefix_vs_off": ratio(med("prefix", "tokens_per_s"), med("off", "tokens_per_s")),
        "ttft_p50_off_vs_session": ratio(med("off", "ttft_ms", "p50"),
                                         med("session", "ttft_ms", "p50")),
        "tps_session_vs_off": ratio(med("session", "tokens_per_s"),
                                    med("off", "tokens_per_s")),
        "hit_rate_prefix": med("prefix", "hit_rate"),
        "hit_rate_off": med("off", "hit_rate"),
        "ttft_p50_nocache_vs_cache": ratio(med("no-cache", "ttft_ms", "p50"),
                                           med("cache", "ttft_ms", "p50")),
        "tps_cache_vs_nocache": ratio(med("cache", "tokens_per_s"),
                                      med("no-cache", "tokens_per_s")),
    }


def results_markdown(report: Mapping[str, Any]) -> str:
    q = report["ratios"]
    rows = render_rows("affinity.row", (
        {**t, "variant": v, "trial": i + 1,
         "hit": "n/a" if t["hit_rate"] is None else f"{t['hit_rate']:.0%}",
         "share": "n/a" if t["affinity_share"] is None else f"{t['affinity_share']:.0%}"}
        for v in VARIANTS for i, t in enumerate(report["variants"][v])))
    hit = q["hit_rate_prefix"]
    return render(
        "affinity", report, rows=rows,
        ttft=fmt_number(q["ttft_p50_off_vs_prefix"], 2),
        ttft99=fmt_number(q["ttft_p99_off_vs_prefix"], 2),
        ttft_verdict=verdict(q["ttft_p50_off_vs_prefix"], TTFT_TARGET),
        tps=fmt_number(q["tps_prefix_vs_off"], 2),
        tps_verdict=verdict(q["tps_prefix_vs_off"], TPS_TARGET),
        hit="n/a" if hit is None else f"{hit:.0%}",
        hit_off="n/a" if q["hit_rate_off"] is None else f"{q['hit_rate_off']:.0%}",
        hit_verdict=verdict(hit, HIT_TARGET),
        s_ttft=fmt_number(q["ttft_p50_off_vs_session"], 2),
        s_tps=fmt_number(q["tps_session_vs_off"], 2),
        c_ttft=fmt_number(q["ttft_p50_nocache_vs_cache"], 2),
        c_tps=fmt_number(q["tps_cache_vs_nocache"], 2),
        ttft_target=TTFT_TARGET, tps_target=TPS_TARGET, hit_target=f"{HIT_TARGET:.0%}")


class Affinity(Scenario[AffinityConfig]):
    name = "affinity"
    title = "cache-affinity claims: shared system prompts and sessions over two workers"
    quick_help = ("the tiny Llama, system prompts of 60 words, 3 turns per session, 6 s of "
                  "arrivals at 6/s per variant, one trial")
    config = AffinityConfig
    trials = (1, 1)
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[AffinityConfig]) -> dict[str, Any]:
        cfg = run.cfg
        source = generation_source(cfg.model, run.out)
        _server, url = run.server()
        arrivals = poisson(cfg.rate, random.Random(cfg.seed), seconds=cfg.seconds)
        requests = workload(cfg, len(arrivals))
        variants: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for trial, order in run.rotations(tuple(VARIANTS)):
            for variant in order:
                say(f"  {variant}")
                workers = _workers(run, url, variant, trial, source)
                try:
                    figures = asyncio.run(_variant(url, workers, variant, cfg, requests,
                                                   arrivals))
                finally:
                    for w in workers:
                        stop_child(w.child)
                variants[variant].append(figures)
                say(f"  TTFT p50 {fmt_number(figures['ttft_ms']['p50'])} ms, p99 "
                    f"{fmt_number(figures['ttft_ms']['p99'])} ms; "
                    f"{fmt_number(figures['tokens_per_s'], 2)} tokens/s; hit rate "
                    f"{fmt_number(figures['hit_rate'], 2)}; affinity share "
                    f"{fmt_number(figures['affinity_share'], 2)}")
        return {"variants": variants, "ratios": _ratios(variants)}


SCENARIO = Affinity()
