"""Scenario ``generate``: continuous batching against request-level batching and batch 1, on
the same Poisson workload, through the whole queue, next to the continuous worker's engine
alone; the method is in benchmarks/README.md.
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
from typing import Any

from benchmarks import charts, corpus
from benchmarks.engines import SCENARIO as engines
from benchmarks.framework import Run, Scenario, noise_of, render, render_keyed
from benchmarks.harness import (
    BenchmarkFailed,
    Cleanup,
    CpuProbe,
    fmt_number,
    markdown_table,
    median_of,
    names_of,
    percentiles,
    positive_float,
    positive_int,
    ratio,
    say,
    stop_child,
)
from benchmarks.loadgen import open_loop
from benchmarks.models import (
    GENERATION_MODELS as MODELS,
)
from benchmarks.models import (
    SLOTS,
    TORCH_THREADS,
    generation_source,
    load_lm,
    serve_engine,
    torch_threads,
    worker_engine,
)
from benchmarks.stack import WorkerProc, median_at, spawn_worker, watchdog

VARIANTS = ("continuous", "request", "bs1", "process")
ORDERS = (("continuous", "process", "request", "bs1"), ("bs1", "request", "process", "continuous"),
          ("request", "continuous", "bs1", "process"))
#: Requests and arrival rates (req/s) per model: full run, --quick run. The rates are above
#: what request-level batching sustains on a 2-core CPU, so every variant runs saturated and
#: throughput is its service capacity.
#: --quick is a smoke test that must end within two minutes: SmolLM2 at batch 1 decodes ~16
#: tokens/s here, so it gets only a few requests.
DEFAULTS = {"tiny": {"requests": (400, 60), "rate": (150.0, 150.0)},
            "smollm2": {"requests": (48, 5), "rate": (2.0, 3.0)}}
PROMPT_TOKENS = (4, 128)
NEW_TOKENS = (8, 128)
WARMUP = 3
#: How long a pass may take at most (SmolLM2 at batch 1 takes minutes).
RESULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class Item:
    at_s: float
    prompt: str
    prompt_tokens: int
    max_new: int


@dataclass(frozen=True, slots=True)
class GenerateConfig:
    models: tuple[str, ...]
    variants: tuple[str, ...]
    requests: dict[str, int]
    rate: dict[str, float]
    seed: int


# ------------------------------------------------------------------------------ workload


def workload(tokenizer: Any, n: int, rate: float, seed: int) -> list[Item]:
    """Poisson arrivals; each prompt is a slice of exactly the drawn number of tokens of a
    deterministic English corpus, decoded to text (re-encoding may shift it by a token)."""
    rng = random.Random(seed)
    text = " ".join(corpus.sentences(400, seed=seed + 1))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    items, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        length = rng.randint(*PROMPT_TOKENS)
        start = rng.randint(0, len(ids) - length - 1)
        prompt = tokenizer.decode(ids[start:start + length]).strip() or "hello"
        items.append(Item(t, prompt, length, rng.randint(*NEW_TOKENS)))
    return items


# ----------------------------------------------------------------------------- variants


def _worker_flags(variant: str, threads: int | None) -> list[str]:
    flags = ["--device", "cpu", *(["--torch-threads", str(threads)] if threads else [])]
    if variant == "continuous":
        return [*flags, "--max-slots", str(SLOTS), "--no-engine-process"]
    if variant == "process":
        return [*flags, "--max-slots", str(SLOTS), "--engine-process"]
    size = "1" if variant == "bs1" else str(SLOTS)
    return [*flags, "--batching", "request", "--max-batch-size", size]


async def _drive(url: str, worker: WorkerProc, items: Sequence[Item], *, warmup: bool
                 ) -> list[Any]:
    """Enqueue at the items' arrival times (all at once for a warm-up) and await every result,
    failing fast if the worker dies."""
    import inferq

    async with inferq.AsyncClient(url) as client:
        async def call(i: int) -> Any:
            handle = await client.enqueue(items[i].prompt, model=worker.model, task="generate",
                                          params={"max_new_tokens": items[i].max_new,
                                                  "ignore_eos": True})
            return await handle.result()

        sent = await open_loop(call, [0.0 if warmup else i.at_s for i in items],
                               watchdog([worker], RESULT_TIMEOUT_S))
        return [r[2] for r in sent.records if r is not None]


def engine_pid(worker_pid: int) -> int | None:
    """The ``--engine-process`` worker's engine process (its child spawned by
    ``multiprocessing``; the other one is multiprocessing's resource tracker)."""
    for children in Path(f"/proc/{worker_pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                return int(pid)
    return None


def _figures(tokens: Sequence[int], span_s: float, ttft: Sequence[float],
             e2e: Sequence[float], batches: Sequence[float]) -> dict[str, Any]:
    """What every variant and the engine alone report: per request its tokens, TTFT, end to
    end and mean batch; ``span_s`` from the first arrival to the last finish."""
    return {"requests": len(tokens), "useful_tokens": sum(tokens), "span_s": round(span_s, 3),
            "tokens_per_s": sum(tokens) / span_s, "requests_per_s": len(tokens) / span_s,
            "ttft_ms": percentiles(ttft, (50, 99)), "e2e_ms": percentiles(e2e, (50, 99)),
            "mean_batch": statistics.fmean(batches)}


def _stats(results: Sequence[Any], items: Sequence[Item]) -> dict[str, Any]:
    span_s = max((max(r.finished_ms for r in results)
                  - min(r.enqueued_ms for r in results)) / 1e3, 1e-9)
    return {**_figures([len(r.output["token_ids"]) for r in results], span_s,
                       [r.ttft_ms if r.ttft_ms is not None else r.total_ms for r in results],
                       [float(r.total_ms) for r in results],
                       [r.batch_size or 1 for r in results]),
            "expected_tokens": sum(i.max_new for i in items),
            "prompt_tokens_mean": statistics.fmean(r.input_tokens or 0 for r in results)}


def run_variant(cleanup: Cleanup, url: str, server_pid: int | None, model: str, source: str,
                variant: str, items: Sequence[Item], warm: Sequence[Item], log_dir: Path,
                trial: int) -> tuple[dict[str, Any], list[list[int]]]:
    """One worker of ``variant`` on its own queue: warmed up, timed on ``items``, stopped."""
    queue_model = f"{model}-{variant}"
    worker = spawn_worker(cleanup, url, model_arg=f"{queue_model}={source}",
                          worker_id=f"bench-{queue_model}-t{trial}", log_dir=log_dir,
                          flags=_worker_flags(variant, TORCH_THREADS[model]), log_level="INFO",
                          task="generate")
    try:
        asyncio.run(_drive(url, worker, warm, warmup=True))
        pids = {"worker": worker.pid, "server": server_pid, "producer": None}
        if variant == "process" and (engine := engine_pid(worker.pid)) is not None:
            pids["engine"] = engine  # its CPU is the worker's too
        probe = CpuProbe(pids)
        probe.start()
        results = asyncio.run(_drive(url, worker, items, warmup=False))
        cpu = probe.stop()
    finally:
        stop_child(worker.child)
    stats = _stats(results, items)
    stats["cpu"] = cpu
    return stats, [list(r.output["token_ids"]) for r in results]


# ----------------------------------------------------------------- engine alone, paced


def engine_alone(source: str, items: Sequence[Item], warm: Sequence[Item], *,
                 threads: int | None, slots: int = SLOTS
                 ) -> tuple[dict[str, Any], list[list[int]]]:
    """The continuous worker's engine on the same requests at the same arrival times, in
    process, with no queue, no Redis and no producer: the ceiling the worker is measured
    against (``continuous / engine alone``). Same slots, KV and prefill budgets, torch threads
    and tokenization as the worker, warmed up on ``warm`` as the worker variants are; the
    variants' ``_figures``, except that TTFT ends at the first token (the worker's at the first
    text a producer can read)."""
    import torch

    from inferq.protocol.generation import GenerationParams

    with torch_threads(threads):
        lm = load_lm(source)
        engine = worker_engine(lm, slots)

        def generations(batch: Sequence[Item], tag: str) -> list[Any]:
            out = []
            for i, item in enumerate(batch):
                g = engine.new_generation(
                    f"{tag}{i}", lm.tokenizer(item.prompt)["input_ids"],
                    GenerationParams(max_new_tokens=item.max_new, ignore_eos=True))
                if not engine.fits_alone(g):  # the worker refuses these up front
                    raise BenchmarkFailed(f"request {i} does not fit the engine's budget")
                out.append(g)
            return out

        serve_engine(engine, generations(warm, "warm"))
        steps, decoded = engine.steps, engine.decoded_tokens
        gens = generations(items, "r")
        cpu = time.process_time()
        start, admitting = serve_engine(engine, gens, [item.at_s for item in items])
        cpu = time.process_time() - cpu  # the engine's CPU: no other thread runs
        arrived = [start + item.at_s for item in items]
        finished = [g.finished_at or start for g in gens]
        ttft = [((g.first_token_at or start) - t) * 1e3 for g, t in zip(gens, arrived, strict=True)]
        e2e = [(f - t) * 1e3 for f, t in zip(finished, arrived, strict=True)]
        span_s = max(max(finished) - min(arrived), 1e-9)  # first arrival to last finish
        # mean batch as the worker reports it: each request's mean batch over its steps
        stats = {**_figures([len(g.tokens) for g in gens], span_s, ttft, e2e,
                            [round(g.batch_sum / max(g.steps, 1)) for g in gens]),
                 "steps": engine.steps - steps, "admission_steps": admitting,
                 "decoded_tokens": engine.decoded_tokens - decoded,
                 "torch_threads": torch.get_num_threads(), "cpu_s": round(cpu, 4)}
        return stats, [list(g.tokens) for g in gens]


# ------------------------------------------------------------------------------ a model


def run_model(run: Run[GenerateConfig], url: str, spid: int | None, model: str, source: str
              ) -> dict[str, Any]:
    """Every trial of one model: the engine alone, then the variants in rotated order."""
    from transformers import AutoTokenizer

    cfg = run.cfg
    tokenizer = AutoTokenizer.from_pretrained(source)
    items = workload(tokenizer, cfg.requests[model], cfg.rate[model], cfg.seed)
    warm = workload(tokenizer, WARMUP, cfg.rate[model], cfg.seed + 99)
    offered = sum(i.max_new for i in items) / items[-1].at_s
    entry: dict[str, Any] = {"requests": len(items), "rate": cfg.rate[model],
                             "offered_tokens_per_s": offered,
                             "variants": {v: [] for v in cfg.variants}, "engine_alone": []}
    tokens_of: dict[str, list[list[int]]] = {}
    for trial in range(run.trials):
        say(f"{model} trial {trial + 1}/{run.trials}: the engine alone, in process "
            f"({len(items)} requests at {cfg.rate[model]:g}/s)")
        alone, alone_tokens = engine_alone(source, items, warm, threads=TORCH_THREADS[model])
        entry["engine_alone"].append(alone)
        tokens_of.setdefault("engine alone", alone_tokens)
        say(f"  {alone['tokens_per_s']:,.0f} tokens/s, TTFT p50 {alone['ttft_ms']['p50']:.0f} ms,"
            f" {alone['steps']} steps ({alone['admission_steps']} admitting)")
        for variant in [v for v in ORDERS[trial % len(ORDERS)] if v in cfg.variants]:
            say(f"{model} trial {trial + 1}/{run.trials}: {variant} "
                f"({len(items)} requests at {cfg.rate[model]:g}/s)")
            stats, tokens = run_variant(run.cleanup, url, spid, model, source, variant, items,
                                        warm, run.log_dir, trial)
            entry["variants"][variant].append(stats)
            tokens_of.setdefault(variant, tokens)
            say(f"  {stats['tokens_per_s']:,.0f} tokens/s, TTFT p50 "
                f"{stats['ttft_ms']['p50']:.0f} ms, e2e p50 {stats['e2e_ms']['p50']:.0f} ms, "
                f"other load {stats['cpu'].get('other_load')}")
    entry["ratios"] = _ratios(entry)
    if "continuous" in tokens_of and len(tokens_of) > 1:
        ref = tokens_of["continuous"]
        same = {k: sum(a == b for a, b in zip(ref, t, strict=True))
                for k, t in tokens_of.items() if k != "continuous"}
        entry["same_tokens"] = ", ".join(f"{k} {n}/{len(ref)}" for k, n in same.items())
    return entry


def _ratios(entry: Mapping[str, Any]) -> dict[str, float | None]:
    def med(variant: str, *path: str) -> float | None:
        return median_at(entry["variants"].get(variant, []), *path)

    cb, req, bs1, proc = (med(x, "tokens_per_s") for x in VARIANTS)
    alone = median_of([t["tokens_per_s"] for t in entry["engine_alone"]])
    ratios = {"tokens_per_s": ratio(cb, req), "ttft_p50": ratio(
                  med("continuous", "ttft_ms", "p50"), med("request", "ttft_ms", "p50")),
              "vs_bs1": ratio(cb, bs1), "vs_engine_alone": ratio(cb, alone),
              "process_vs_request": ratio(proc, req),
              "process_vs_engine_alone": ratio(proc, alone), "process_vs_thread": ratio(proc, cb),
              "process_engine_cpu": ratio(median_of(
                  [t["cpu"]["engine"] / t["useful_tokens"] for t in entry["variants"].get(
                      "process", []) if t["cpu"].get("engine")]), median_of(
                  [t["cpu_s"] / t["useful_tokens"] for t in entry["engine_alone"]
                   if t.get("cpu_s")]))}
    return {k: v for k, v in ratios.items() if v is not None}


# ------------------------------------------------------------------------------- report


def _variant_runs(m: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """Each variant's trials, the engine alone included."""
    runs = {v: list(r) for v, r in m["variants"].items() if r}
    if m.get("engine_alone"):
        runs["engine alone"] = list(m["engine_alone"])
    return runs


def draw_plots(report: Mapping[str, Any], folder: Path) -> list[Path]:
    """Tokens/s of every variant as a share of request-level batching (one group per model),
    and per model its latency percentiles by variant; medians over trials, bars min..max."""
    models = [m for m, e in report["models"].items() if e["variants"].get("request")]
    if not models:
        return []
    names = [n for n in ("continuous", "process", "request", "bs1", "engine alone")
             if any(n in _variant_runs(report["models"][m]) for m in models)]

    def pct(model: str, name: str) -> list[float]:
        base = median_of([t["tokens_per_s"] for t in report["models"][model]["variants"][
            "request"]])
        runs = _variant_runs(report["models"][model]).get(name, [])
        return [t["tokens_per_s"] / base * 100 for t in runs] if base else []

    paths = [charts.trial_bars(
        folder / "generate-throughput.png",
        title="Useful tokens/s, % of request-level batching", ylabel="% of request-level",
        groups=models, values={n: [pct(m, n) for m in models] for n in names},
        hlines=[("target for continuous: 150 %", 150.0)],
        note="median over trials, bars = min..max; engine alone = the continuous worker's "
             "engine on the same paced requests, no queue")]
    for model in models:
        runs = _variant_runs(report["models"][model])
        groups = [n for n in names if n in runs]
        paths.append(charts.trial_bars(
            folder / f"generate-latency-{model}.png",
            title=f"{model}: time to first token and end to end, by variant",
            ylabel="ms (log scale)", groups=groups, logy=True,
            values={label: [[t[f][q] for t in runs[g] if t[f][q] is not None] for g in groups]
                    for label, f, q in (("TTFT p50", "ttft_ms", "p50"),
                                        ("TTFT p99", "ttft_ms", "p99"),
                                        ("e2e p50", "e2e_ms", "p50"),
                                        ("e2e p99", "e2e_ms", "p99"))},
            note="median over trials, bars = min..max; TTFT: first text a producer can read "
                 "(engine alone: first token)"))
    return paths


def _row(label: str, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """A variant's row: medians over its trials (the engine alone has no tenants' load)."""
    loads = [t["cpu"].get("other_load") for t in runs if "cpu" in t]
    load = median_of(loads)
    return [label, *(fmt_number(median_of([t[k] if q is None else t[k][q] for t in runs]))
                     for k, q in (("tokens_per_s", None), ("ttft_ms", "p50"),
                                  ("ttft_ms", "p99"), ("e2e_ms", "p50"), ("e2e_ms", "p99"))),
            fmt_number(median_of([t["mean_batch"] for t in runs]), 1),
            "n/a" if not loads else fmt_number(None if load is None else load * 100)]


def results_markdown(report: Mapping[str, Any]) -> str:
    models = []
    for model, m in report["models"].items():
        rows = [_row(f"**{variant}**" if variant == "continuous" else variant, runs)
                for variant, runs in m["variants"].items()]
        if m.get("engine_alone"):
            rows.append(_row("engine alone (in process: no queue, Redis or producer)",
                             m["engine_alone"]))
        got = m.get("ratios", {})
        ok = {k: "" if got.get(k) is None else "PASS" if passed(got[k]) else "FAIL"
              for k, passed in (("tokens_per_s", lambda v: v >= 1.5),
                                ("ttft_p50", lambda v: v < 1.0))}
        models.append(render("generate.model", m, model=model, table=markdown_table(
            ["variant", "useful tokens/s", "TTFT p50 ms", "TTFT p99 ms", "e2e p50 ms",
             "e2e p99 ms", "mean batch", "other tenants' load %"], rows), verdicts="\n".join(
            f"- {line}" for line in render_keyed("generate.verdicts", {
                **got, "same_tokens": m.get("same_tokens")}, ok=ok))))
    return render("generate", report, models="\n".join(models), slots=SLOTS,
                  prompt_min=PROMPT_TOKENS[0], prompt_max=PROMPT_TOKENS[1],
                  new_min=NEW_TOKENS[0], new_max=NEW_TOKENS[1], threads=", ".join(
                      f"{m} {TORCH_THREADS[m] or 'default'}" for m in report["models"]))


# ------------------------------------------------------------------------------ scenario


class Generate(Scenario[GenerateConfig]):
    name = "generate"
    title = "continuous batching vs request-level batching vs batch 1"
    quick_help = "tiny 60 requests, SmolLM2 5, one trial (~110 s once SmolLM2 is converted)"
    config = GenerateConfig
    trials = (2, 1)
    plots = staticmethod(draw_plots)
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--models", type=names_of(MODELS), default=MODELS,
                            help=f"comma-separated, from {', '.join(MODELS)}")
        parser.add_argument("--variants", type=names_of(VARIANTS), default=VARIANTS,
                            help=f"comma-separated, from {', '.join(VARIANTS)}")
        parser.add_argument("--requests", type=positive_int, default=None,
                            help="requests per model and variant (default per model)")
        parser.add_argument("--rate", type=positive_float, default=None,
                            help="Poisson arrival rate, requests/s (default per model)")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--compare-engines", action="store_true",
                            help="then run the engines scenario (python -m benchmarks engines) "
                                 "on the same models")

    def configure(self, args: argparse.Namespace) -> GenerateConfig:
        q = 1 if args.quick else 0
        return GenerateConfig(
            args.models, args.variants,
            requests={m: args.requests or DEFAULTS[m]["requests"][q] for m in args.models},
            rate={m: args.rate or DEFAULTS[m]["rate"][q] for m in args.models}, seed=args.seed)

    def measure(self, run: Run[GenerateConfig]) -> dict[str, Any]:
        cfg = run.cfg
        say(f"generate benchmark: models {cfg.models}, variants {cfg.variants}, "
            f"{run.trials} trial(s)")
        server, url = run.server()
        spid = server.pid
        sources = {m: generation_source(m, run.out) for m in cfg.models}
        models = {m: run_model(run, url, spid, m, sources[m]) for m in cfg.models}
        server.stop()
        loads = [t["cpu"].get("other_load") for m in models.values()
                 for runs in m["variants"].values() for t in runs]
        return {"models": models, "noise": noise_of(loads)}


    def main(self, args: argparse.Namespace) -> int:
        code = super().main(args)
        if code or not args.compare_engines:
            return code
        parser = argparse.ArgumentParser()
        engines.build_parser(parser)
        return engines.main(parser.parse_args([
            "--models", ",".join(args.models), "--out", str(args.out),
            "--results-md", str(args.results_md), *(["--quick"] if args.quick else []),
            *(["--no-results-md"] if args.no_results_md else [])]))


SCENARIO = Generate()
