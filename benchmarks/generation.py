"""``python -m benchmarks generate``: continuous batching against request-level batching and
batch 1, on the same Poisson workload, through the whole queue.

Workload (deterministic from ``--seed``): Poisson arrivals at ``--rate`` requests/s, prompt
lengths uniform in 4..128 tokens, ``max_new_tokens`` uniform in 8..128, greedy with
``ignore_eos`` so every variant produces exactly the same useful tokens. Each variant is one
``inferq worker --task generate`` process serving its own queue, run one after the other (the
order rotates per trial) against an embedded server with AOF:

* ``continuous``: iteration-level batching (the default ``generate`` worker, 16 slots);
* ``request``: request-level batching, ``--batching request`` (the adaptive window worker,
  batches of up to 16 run through one padded ``generate``);
* ``bs1``: ``--batching request --max-batch-size 1`` (each request alone).

Reported per variant: useful tokens/s (completion tokens / (last finish - first enqueue)),
time to first token p50/p99 (first text visible to the producer: the first stream entry for
``continuous``, the result for the others, which do not stream) and end-to-end latency p50/p99.
Targets: continuous >= 1.5x the useful tokens/s of request-level, with a lower p50 TTFT.

``--compare-engines`` adds the in-process measurement behind the engine choice
(``inferq/worker/generate/engine.py``): our KV-cache loop vs transformers'
``init_continuous_batching`` (configured: small pages, bounded cache) vs padded ``generate``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import charts, corpus
from benchmarks.harness import (
    Child,
    Cleanup,
    CpuProbe,
    command_line,
    describe_machine,
    dying_with_parent,
    machine_info,
    markdown_table,
    now_utc,
    percentile,
    say,
    stop_child,
    usable_cpus,
)
from benchmarks.stack import save_report

NAME = "generate"
BENCH_DIR = Path(__file__).resolve().parent
VARIANTS = ("continuous", "request", "bs1")
ORDERS = (("continuous", "request", "bs1"), ("bs1", "request", "continuous"),
          ("request", "continuous", "bs1"))
MODELS = ("tiny", "smollm2")
#: Requests and arrival rates (req/s) per model: full run, --quick run. The rates are above
#: what request-level batching sustains on a 2-core CPU, so every variant runs saturated and
#: throughput is its service capacity.
#: --quick is a smoke test that must end within two minutes: SmolLM2 at batch 1 decodes ~16
#: tokens/s here, so it gets only a few requests.
DEFAULTS = {"tiny": {"requests": (400, 60), "rate": (150.0, 150.0)},
            "smollm2": {"requests": (48, 5), "rate": (2.0, 3.0)}}
#: torch intra-op threads per worker (all variants alike): the tiny model's matmuls are too
#: small to gain from two threads, and their barriers stall when other tenants use the cores.
TORCH_THREADS: dict[str, int | None] = {"tiny": 1, "smollm2": None}
PROMPT_TOKENS = (4, 128)
NEW_TOKENS = (8, 128)
SLOTS = 16
WARMUP = 3
#: The engine comparison also runs our engine next to a thread that holds the GIL this long
#: in every period (20%), to show what a busy event loop in the same process costs it, and
#: next to a process that does the same work (the same CPU, no GIL shared), to show how much
#: of that an engine in a process of its own would win back.
GIL_BUSY_MS = 1.0
GIL_PERIOD_MS = 5.0


def busy_python(halt: Any) -> None:
    """Run Python GIL_BUSY_MS in every GIL_PERIOD_MS until ``halt`` (a threading or a
    multiprocessing Event) is set."""
    while not halt.is_set():
        until = time.perf_counter() + GIL_BUSY_MS / 1e3
        while time.perf_counter() < until:
            pass
        halt.wait((GIL_PERIOD_MS - GIL_BUSY_MS) / 1e3)


@dataclass(frozen=True, slots=True)
class Item:
    at_s: float
    prompt: str
    prompt_tokens: int
    max_new: int


@dataclass(frozen=True, slots=True)
class Config:
    models: tuple[str, ...]
    variants: tuple[str, ...]
    requests: dict[str, int]
    rate: dict[str, float]
    trials: int
    seed: int
    quick: bool
    compare_engines: bool
    out: Path
    results_md: Path | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: tiny 120 requests, SmolLM2 24, one trial")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per model and variant (default per model)")
    parser.add_argument("--rate", type=float, default=None,
                        help="Poisson arrival rate, requests/s (default per model)")
    parser.add_argument("--trials", type=int, default=None, help="default 2; 1 with --quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-engines", action="store_true",
                        help="also measure our engine vs transformers' continuous batching vs "
                             "padded generate, in process")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--no-results-md", action="store_true",
                        help="do not update benchmarks/RESULTS.md")


def config_from_args(args: argparse.Namespace) -> Config:
    models = tuple(m for m in args.models.split(",") if m)
    variants = tuple(v for v in args.variants.split(",") if v)
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"benchmarks generate: unknown model {m!r}; known: {MODELS}")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"benchmarks generate: unknown variant {v!r}; known: {VARIANTS}")
    q = 1 if args.quick else 0
    requests = {m: args.requests or DEFAULTS[m]["requests"][q] for m in models}
    rate = {m: args.rate or DEFAULTS[m]["rate"][q] for m in models}
    if any(n < 1 for n in requests.values()) or any(r <= 0 for r in rate.values()):
        raise SystemExit("benchmarks generate: --requests and --rate must be > 0")
    trials = args.trials or (1 if args.quick else 2)
    return Config(models, variants, requests, rate, trials, args.seed, args.quick,
                  args.compare_engines, args.out,
                  None if args.no_results_md else BENCH_DIR / "RESULTS.md")


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


def _model_source(model: str, out: Path) -> str:
    if model == "tiny":
        folder = out / "models" / "tiny-llama"
        if not (folder / "config.json").exists():
            from inferq.worker.generation.tiny import build_tiny_model

            say(f"building the tiny random Llama in {folder}")
            build_tiny_model(folder)
        return str(folder)
    from inferq.worker.models.convert import ensure_smollm2

    return str(ensure_smollm2())


def _worker_argv(url: str, variant: str, queue_model: str, source: str,
                 threads: int | None) -> list[str]:
    argv = [sys.executable, "-m", "inferq", "worker", "--redis-url", url, "--task", "generate",
            "--model", f"{queue_model}={source}", "--device", "cpu",
            "--worker-id", f"bench-{queue_model}"]
    if threads is not None:
        argv += ["--torch-threads", str(threads)]
    if variant == "continuous":
        return [*argv, "--max-slots", str(SLOTS)]
    size = "1" if variant == "bs1" else str(SLOTS)
    return [*argv, "--batching", "request", "--max-batch-size", size]


async def _drive(url: str, queue_model: str, items: Sequence[Item], child: Child,
                 *, warmup: bool) -> list[Any]:
    """Enqueue at the items' arrival times, await every result; fail fast if the worker
    died."""
    import inferq

    async with inferq.AsyncClient(url) as client:
        start = time.monotonic()
        handles: list[Any] = []

        async def feed() -> None:
            for item in items:
                delay = start + item.at_s - time.monotonic()
                if delay > 0 and not warmup:
                    await asyncio.sleep(delay)
                handles.append(await client.enqueue(
                    item.prompt, model=queue_model, task="generate",
                    params={"max_new_tokens": item.max_new, "ignore_eos": True}))

        await feed()
        results = []
        for handle in handles:
            while True:
                try:
                    results.append(await handle.result(timeout=2.0))
                    break
                except inferq.ResultTimeout:
                    if not child.alive():
                        raise RuntimeError(f"worker died:\n{child.log_tail()}") from None
        return results


def _stats(results: Sequence[Any], items: Sequence[Item]) -> dict[str, Any]:
    tokens = [len(r.output["token_ids"]) for r in results]
    expected = sum(i.max_new for i in items)
    first = min(r.enqueued_ms for r in results)
    last = max(r.finished_ms for r in results)
    span_s = max((last - first) / 1e3, 1e-9)
    ttft = [r.ttft_ms if r.ttft_ms is not None else r.total_ms for r in results]
    e2e = [float(r.total_ms) for r in results]
    return {
        "requests": len(results),
        "useful_tokens": sum(tokens),
        "expected_tokens": expected,
        "span_s": round(span_s, 3),
        "tokens_per_s": sum(tokens) / span_s,
        "requests_per_s": len(results) / span_s,
        "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)},
        "e2e_ms": {"p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
        "mean_batch": statistics.fmean(r.batch_size or 1 for r in results),
        "prompt_tokens_mean": statistics.fmean(r.input_tokens or 0 for r in results),
    }


def run_variant(cleanup: Cleanup, url: str, server_pid: int | None, model: str, source: str,
                variant: str, items: Sequence[Item], warm: Sequence[Item], log_dir: Path,
                trial: int) -> tuple[dict[str, Any], list[list[int]]]:
    queue_model = f"{model}-{variant}"
    child = cleanup.spawn(f"worker {queue_model}",
                          _worker_argv(url, variant, queue_model, source, TORCH_THREADS[model]),
                          log_path=log_dir / f"generate-{queue_model}-t{trial}.log")
    try:
        asyncio.run(_drive(url, queue_model, warm, child, warmup=True))
        probe = CpuProbe({"worker": child.process.pid, "server": server_pid,
                          "producer": None})
        probe.start()
        results = asyncio.run(_drive(url, queue_model, items, child, warmup=False))
        cpu = probe.stop()
    finally:
        stop_child(child)
    stats = _stats(results, items)
    stats["cpu"] = cpu
    return stats, [list(r.output["token_ids"]) for r in results]


# ----------------------------------------------------------------- engine alone, paced


def serve_engine(engine: Any, gens: Sequence[Any],
                 arrivals_s: Sequence[float] | None = None) -> tuple[float, int]:
    """Run ``gens`` through ``engine`` step by step until all finish, each joining the waiting
    line at its offset in ``arrivals_s`` (seconds from the start; None: all at once). Returns
    the start (``time.monotonic``) and how many steps admitted sequences."""
    at = list(arrivals_s) if arrivals_s is not None else [0.0] * len(gens)
    pending, waiting = list(zip(at, gens, strict=True)), []
    admitting = 0
    start = time.monotonic()
    while pending or waiting or engine.running:
        now = time.monotonic() - start
        while pending and pending[0][0] <= now:
            waiting.append(pending.pop(0)[1])
        if not waiting and not engine.running:
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        admitted = engine.select(waiting)
        for g in admitted:
            waiting.remove(g)
        engine.step(admitted)
        admitting += bool(admitted)
    return start, admitting


def engine_alone(source: str, items: Sequence[Item], warm: Sequence[Item], *,
                 threads: int | None, slots: int = SLOTS
                 ) -> tuple[dict[str, Any], list[list[int]]]:
    """The continuous worker's engine on the same requests at the same arrival times, in
    process, with no queue, no Redis and no producer: the ceiling the worker is measured
    against (``continuous / engine alone``). Same slots, KV and prefill budgets, torch threads
    and tokenization as the worker, warmed up on ``warm`` as the worker variants are; figures
    computed as ``_stats`` does, except that TTFT ends at the first token (the worker's at the
    first text a producer can read)."""
    import torch

    from inferq.protocol.generation import GenerationParams
    from inferq.worker.generate.engine import Engine, Generation
    from inferq.worker.generate.settings import GenerationSettings
    from inferq.worker.models.lm import CausalLM

    default_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        lm = CausalLM(source, device=torch.device("cpu"), dtype=torch.float32)
        engine = Engine(lm, GenerationSettings(max_slots=slots).budget(lm))

        def generations(batch: Sequence[Item], tag: str) -> list[Generation]:
            out = []
            for i, item in enumerate(batch):
                g = engine.new_generation(
                    f"{tag}{i}", lm.tokenizer(item.prompt)["input_ids"],
                    GenerationParams(max_new_tokens=item.max_new, ignore_eos=True))
                if not engine.fits_alone(g):  # the worker refuses these up front
                    raise RuntimeError(f"request {i} does not fit the engine's budget")
                out.append(g)
            return out

        serve_engine(engine, generations(warm, "warm"))
        steps, decoded = engine.steps, engine.decoded_tokens
        gens = generations(items, "r")
        start, admitting = serve_engine(engine, gens, [item.at_s for item in items])
        arrived = [start + item.at_s for item in items]
        finished = [g.finished_at or start for g in gens]
        ttft = [((g.first_token_at or start) - t) * 1e3 for g, t in zip(gens, arrived, strict=True)]
        e2e = [(f - t) * 1e3 for f, t in zip(finished, arrived, strict=True)]
        tokens = sum(len(g.tokens) for g in gens)
        span_s = max(max(finished) - min(arrived), 1e-9)  # first arrival to last finish
        stats = {"requests": len(gens), "useful_tokens": tokens, "span_s": round(span_s, 3),
                 "tokens_per_s": tokens / span_s,
                 "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)},
                 "e2e_ms": {"p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
                 # as the worker reports it: each request's mean batch over its steps
                 "mean_batch": statistics.fmean(round(g.batch_sum / max(g.steps, 1))
                                                for g in gens),
                 "steps": engine.steps - steps, "admission_steps": admitting,
                 "decoded_tokens": engine.decoded_tokens - decoded,
                 "torch_threads": torch.get_num_threads()}
        return stats, [list(g.tokens) for g in gens]
    finally:
        torch.set_num_threads(default_threads)


# ------------------------------------------------------------------------ engine compare


def compare_engines(source: str, *, requests: int, new_tokens: int, slots: int,
                    trials: int, hf_timeout_s: float, threads: int | None) -> dict[str, Any]:
    """Tokens/s of the three ways to batch generation, in process, same prompts, interleaved
    trials: our engine, transformers' ContinuousBatchingManager, padded generate."""
    import torch

    default_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _compare(source, requests=requests, new_tokens=new_tokens, slots=slots,
                        trials=trials, hf_timeout_s=hf_timeout_s)
    finally:
        torch.set_num_threads(default_threads)


def _compare(source: str, *, requests: int, new_tokens: int, slots: int, trials: int,
             hf_timeout_s: float) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from inferq.protocol.generation import GenerationParams
    from inferq.worker.generate.engine import Engine
    from inferq.worker.generate.scheduler import Budget
    from inferq.worker.models.lm import CausalLM

    lm = CausalLM(source, device=torch.device("cpu"), dtype=torch.float32)
    prompts = [lm.tokenizer(f"Request number {i} asks the queue worker about its day",
                            add_special_tokens=False)["input_ids"] for i in range(requests)]

    def ours() -> float:
        engine = Engine(lm, Budget(max_slots=slots, kv_tokens=1 << 24,
                                   max_prefill_tokens=4096))
        params = GenerationParams(max_new_tokens=new_tokens, ignore_eos=True)
        gens = [engine.new_generation(f"r{i}", p, params) for i, p in enumerate(prompts)]
        start, _ = serve_engine(engine, gens)
        return requests * new_tokens / (time.monotonic() - start)

    def hf() -> float | None:
        gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                               pad_token_id=lm.pad_id)
        page = 16
        cb = ContinuousBatchingConfig(
            page_size=page, num_blocks=requests * (new_tokens + 64) // page + 16,
            max_batch_tokens=512, max_requests_per_batch=slots, allow_block_sharing=False)
        manager = lm.model.init_continuous_batching(generation_config=gen,
                                                    continuous_batching_config=cb)
        manager.start()
        try:
            t = time.perf_counter()
            for p in prompts:
                manager.add_request(p, max_new_tokens=new_tokens)
            done = tokens = 0
            while done < requests:
                out = manager.get_result(timeout=max(0.1, hf_timeout_s
                                                     - (time.perf_counter() - t)))
                if out is None:
                    return None
                if out.is_finished():
                    done += 1
                    tokens += len(out.generated_tokens)
            return tokens / (time.perf_counter() - t)
        finally:
            manager.stop(block=True)
            with contextlib.suppress(Exception):
                lm.model.destroy_cached_continuous_batching_manager()

    def padded() -> float:
        t = time.perf_counter()
        for start in range(0, requests, slots):
            chunk = prompts[start:start + slots]
            width = max(map(len, chunk))
            ids = torch.tensor([[lm.pad_id] * (width - len(c)) + c for c in chunk])
            mask = (torch.arange(width)[None] >= torch.tensor(
                [width - len(c) for c in chunk])[:, None]).long()
            with torch.inference_mode():
                lm.model.generate(input_ids=ids, attention_mask=mask,
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=False, pad_token_id=lm.pad_id)
        return requests * new_tokens / (time.perf_counter() - t)

    def ours_sharing_the_gil() -> float:
        """``ours`` while another thread of the process runs Python 1 ms in every 5 (what a
        worker's event loop does between Redis round trips: claims, stream writes)."""
        halt = threading.Event()
        thread = threading.Thread(target=busy_python, args=(halt,), daemon=True)
        thread.start()
        try:
            return ours()
        finally:
            halt.set()
            thread.join()

    def ours_next_to_a_busy_process() -> float:
        """``ours`` while another process does what the thread above does: the same CPU
        taken from the machine, but no GIL shared."""
        spawn = multiprocessing.get_context("spawn")
        halt = spawn.Event()
        process = spawn.Process(target=busy_python, args=(halt,), daemon=True)
        process.start()
        try:
            return ours()
        finally:
            halt.set()
            process.join(10)

    runs: dict[str, list[float | None]] = {"ours": [], "ours_sharing_the_gil": [],
                                           "ours_next_to_a_busy_process": [],
                                           "transformers_cb": [], "padded_generate": []}
    ours()  # warm-up
    probe = CpuProbe({"bench": None})
    before = os.times()
    probe.start()
    for _ in range(trials):
        runs["ours"].append(ours())
        runs["ours_sharing_the_gil"].append(ours_sharing_the_gil())
        runs["ours_next_to_a_busy_process"].append(ours_next_to_a_busy_process())
        runs["transformers_cb"].append(hf())
        runs["padded_generate"].append(padded())
    load = probe.stop()
    after = os.times()
    # The busy processes are ours, not other tenants': take their CPU out of other_load.
    busy_s = (after.children_user + after.children_system
              - before.children_user - before.children_system)
    other = load.get("other_load")
    if other is not None and load["wall_s"]:
        other = round(max(0.0, other - busy_s / (load["wall_s"] * usable_cpus())), 3)
    return {"requests": requests, "new_tokens": new_tokens, "slots": slots,
            "torch_threads": torch.get_num_threads(), "tokens_per_s": runs,
            "busy_process_cpu_s": round(busy_s, 3), "other_load": other}


# ------------------------------------------------------------------------------- report


def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _reading(report: Mapping[str, Any]) -> list[str]:
    """What the tiny model's figures mean, from this run's numbers."""
    tiny, engines = report["models"].get("tiny"), report.get("engines", {}).get("tiny")
    if not tiny or not engines:
        return []
    t = engines["tokens_per_s"]
    alone, thread = _med(t["ours"]), _med(t.get("ours_sharing_the_gil", []))
    process = _med(t.get("ours_next_to_a_busy_process", []))

    def worker(variant: str, key: str = "tokens_per_s") -> float | None:
        runs = tiny["variants"].get(variant, [])
        if key == "cores":
            return _med([r["cpu"]["worker"] / r["cpu"]["wall_s"] for r in runs
                         if r["cpu"].get("worker") is not None and r["cpu"].get("wall_s")])
        return _med([r[key] for r in runs])

    continuous, request, cores = worker("continuous"), worker("request"), worker(
        "continuous", "cores")
    if None in (alone, thread, process, continuous, request):
        return []
    assert alone is not None and thread is not None and process is not None
    busy = f"{GIL_BUSY_MS / GIL_PERIOD_MS:.0%}"
    ceiling = tiny.get("ratios", {}).get("vs_engine_alone")
    vs_alone = ("" if ceiling is None
                else f" ({ceiling:.2f}x of its engine alone on the same paced requests)")
    used = "" if cores is None else f"The continuous worker's process used {cores:.2f} cores: "
    small = report.get("engines", {}).get("smollm2", {}).get("tokens_per_s", {})
    small_alone, small_thread, small_process = (
        _med(small.get(k, [])) for k in ("ours", "ours_sharing_the_gil",
                                         "ours_next_to_a_busy_process"))
    smollm2: list[str] = []
    if small_alone and small_thread is not None and small_process is not None:
        smollm2 = [f"SmolLM2 (two torch threads) makes {small_thread / small_alone:.2f}x of "
                   f"its engine alone next to the thread and {small_process / small_alone:.2f}x "
                   "next to the process, but each of its steps is long, so the worker's event "
                   "loop is a small share of it."]
    gil = (process - thread) / alone
    if gil < 0.05:
        why = ("what another thread or process takes from the two vCPUs comes straight out "
               "of it; sharing the GIL adds little")
        gain = ("little on this machine: most of the loss is CPU, which a GPU worker does not "
                "spend on the model")
    else:
        why = (f"sharing the GIL alone costs it {gil:.2f}x of its speed in this run, the CPU "
               f"the other thread or process takes {1 - process / alone:.2f}x")
        gain = ("much of the gap to the engine alone (not built here, so not measured); the "
                "rest is CPU, which a GPU worker does not spend on the model")
    return [
        f"Reading: in process, alone, the engine makes {alone:,.0f} tokens/s on the tiny "
        f"model; next to a thread that runs Python {busy} of the time, {thread:,.0f} "
        f"({thread / alone:.2f}x); next to a process doing the same, {process:,.0f} "
        f"({process / alone:.2f}x). A decode step of this model is many small torch calls: "
        f"{why}. {used or 'The continuous worker: '}its event loop is busy throughout "
        "(claims, stream and result writes, wake-ups) next to the model thread, and Redis "
        f"and the producer share the vCPUs. It makes {continuous:,.0f} tokens/s on the "
        f"queue's requests{vs_alone} against {request:,.0f} for the request-level worker, "
        "whose event loop rests while a batch runs. An engine in a process of its own (as "
        f"vLLM's engine core) would take the model off the event loop's GIL and could win "
        f"back {gain}."
        + "".join(" " + line for line in smollm2),
        "",
    ]


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
    names = [n for n in ("continuous", "request", "bs1", "engine alone")
             if any(n in _variant_runs(report["models"][m]) for m in models)]

    def pct(model: str, name: str, pick: Any) -> float | None:
        runs = _variant_runs(report["models"][model]).get(name, [])
        base = _med([t["tokens_per_s"] for t in report["models"][model]["variants"]["request"]])
        vals = [t["tokens_per_s"] for t in runs]
        return pick(vals) / base * 100 if vals and base else None

    paths = [charts.grouped_bars(
        folder / "generate-throughput.png",
        title="Useful tokens/s, % of request-level batching", ylabel="% of request-level",
        groups=models,
        bars={n: [pct(m, n, statistics.median) for m in models] for n in names},
        low={n: [pct(m, n, min) for m in models] for n in names},
        high={n: [pct(m, n, max) for m in models] for n in names},
        hlines=[("target for continuous: 150 %", 150.0)],
        note="median over trials, bars = min..max; engine alone = the continuous worker's "
             "engine on the same paced requests, no queue")]
    for model in models:
        runs = _variant_runs(report["models"][model])
        keys = [("TTFT p50", "ttft_ms", "p50"), ("TTFT p99", "ttft_ms", "p99"),
                ("e2e p50", "e2e_ms", "p50"), ("e2e p99", "e2e_ms", "p99")]
        groups = [n for n in names if n in runs]

        def at(name: str, field: str, q: str, pick: Any,
               runs: Mapping[str, list[Mapping[str, Any]]] = runs) -> float | None:
            vals = [t[field][q] for t in runs[name] if t[field][q] is not None]
            return pick(vals) if vals else None

        paths.append(charts.grouped_bars(
            folder / f"generate-latency-{model}.png",
            title=f"{model}: time to first token and end to end, by variant",
            ylabel="ms (log scale)", groups=groups, logy=True,
            bars={k: [at(g, f, q, statistics.median) for g in groups] for k, f, q in keys},
            low={k: [at(g, f, q, min) for g in groups] for k, f, q in keys},
            high={k: [at(g, f, q, max) for g in groups] for k, f, q in keys},
            note="median over trials, bars = min..max; TTFT: first text a producer can read "
                 "(engine alone: first token)"))
    return paths


def results_markdown(report: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    cfg = report["config"]
    lines = ["## generate: continuous batching vs request-level batching vs batch 1", ""]
    if cfg["quick"]:
        lines += ["> **Quick run** (`--quick`): a smoke test with few requests and one trial, "
                  "not a measurement.", ""]
    loads = [t["cpu"].get("other_load") for m in report["models"].values()
             for runs in m["variants"].values() for t in runs]
    worst = max((x for x in loads if x is not None), default=None)
    if worst is not None and worst > 0.10:
        lines += [f"> **Disturbed run**: other processes used up to {worst:.0%} of the machine "
                  "during a measurement; wall-clock figures are unreliable. Final numbers "
                  "need a quiet machine.", ""]
    lines += [
        f"- Command: `{report['command']}` ({report['seconds']:.0f} s)",
        f"- Date: {report['date']}; git {str(report['machine']['git']['commit'])[:10]}",
        f"- Machine: {describe_machine(report['machine'])}",
        f"- Workload: Poisson arrivals; prompts {PROMPT_TOKENS[0]}..{PROMPT_TOKENS[1]} tokens, "
        f"`max_new_tokens` {NEW_TOKENS[0]}..{NEW_TOKENS[1]} (uniform), greedy with "
        "`ignore_eos` (every variant makes the same tokens); embedded server with AOF, one "
        "`inferq worker --task generate` per variant, run one after the other; "
        f"{cfg['trials']} trial(s), median over trials. Worker torch threads: "
        + ", ".join(f"{m} {TORCH_THREADS[m] or 'default'}" for m in report["models"]) + ".",
        "- Variants: **continuous** = iteration-level batching (default worker, "
        f"`--max-slots {SLOTS}`); **request** = `--batching request --max-batch-size {SLOTS}` "
        "(adaptive window, padded `generate`); **bs1** = `--batching request "
        "--max-batch-size 1`; **engine alone** = the continuous worker's engine on the same "
        "requests at the same arrival times, in the benchmark's process (same slots, budget "
        "and torch threads; its TTFT ends at the first token): the ceiling for the continuous "
        "worker.",
        "- TTFT = enqueue to first text visible to the producer (continuous: its stream; the "
        "others do not stream, so their TTFT is the result). Tokens/s = completion tokens / "
        "(last finish - first enqueue).",
        "",
    ]
    for model, m in report["models"].items():
        lines += [f"### {model} ({m['requests']} requests at {m['rate']:g} req/s offered, "
                  f"{m['offered_tokens_per_s']:,.0f} tokens/s offered)", ""]
        rows = []
        for variant, runs in m["variants"].items():
            rows.append([
                f"**{variant}**" if variant == "continuous" else variant,
                _fmt(_med([t["tokens_per_s"] for t in runs])),
                _fmt(_med([t["ttft_ms"]["p50"] for t in runs])),
                _fmt(_med([t["ttft_ms"]["p99"] for t in runs])),
                _fmt(_med([t["e2e_ms"]["p50"] for t in runs])),
                _fmt(_med([t["e2e_ms"]["p99"] for t in runs])),
                _fmt(_med([t["mean_batch"] for t in runs]), 1),
                _fmt(_med([t["cpu"].get("other_load") for t in runs]) * 100
                     if _med([t["cpu"].get("other_load") for t in runs]) is not None
                     else None),
            ])
        alone = m.get("engine_alone", [])
        if alone:
            rows.append([
                "engine alone (in process: no queue, Redis or producer)",
                _fmt(_med([t["tokens_per_s"] for t in alone])),
                _fmt(_med([t["ttft_ms"]["p50"] for t in alone])),
                _fmt(_med([t["ttft_ms"]["p99"] for t in alone])),
                _fmt(_med([t["e2e_ms"]["p50"] for t in alone])),
                _fmt(_med([t["e2e_ms"]["p99"] for t in alone])),
                _fmt(_med([t["mean_batch"] for t in alone]), 1), "n/a"])
        lines += [markdown_table(["variant", "useful tokens/s", "TTFT p50 ms", "TTFT p99 ms",
                                  "e2e p50 ms", "e2e p99 ms", "mean batch",
                                  "other tenants' load %"], rows), ""]
        ratio = m.get("ratios", {})
        verdicts = []
        if ratio.get("tokens_per_s") is not None:
            ok = ratio["tokens_per_s"] >= 1.5
            verdicts.append(f"continuous / request tokens/s = **{ratio['tokens_per_s']:.2f}** "
                            f"(target >= 1.5: {'PASS' if ok else 'FAIL'})")
        if ratio.get("ttft_p50") is not None:
            ok = ratio["ttft_p50"] < 1.0
            verdicts.append(f"continuous / request TTFT p50 = **{ratio['ttft_p50']:.2f}** "
                            f"(target < 1: {'PASS' if ok else 'FAIL'})")
        if ratio.get("vs_bs1") is not None:
            verdicts.append(f"continuous / bs1 tokens/s = {ratio['vs_bs1']:.2f}")
        if ratio.get("vs_engine_alone") is not None:
            verdicts.append("continuous / engine alone tokens/s = "
                            f"{ratio['vs_engine_alone']:.2f} (what serving through the queue "
                            "costs the model on this machine)")
        if m.get("same_tokens") is not None:
            verdicts.append(f"requests whose tokens equal the continuous variant's: "
                            f"{m['same_tokens']}")
        lines += [f"- {v}" for v in verdicts] + [""]
    engines = report.get("engines")
    if engines:
        lines += ["### Engine choice: our KV-cache loop vs transformers' continuous batching",
                  "", f"In process, no queue; the same prompts, {SLOTS} sequences at a time, "
                  "trials interleaved (median; `n/a`: did not finish in time). transformers' "
                  "manager is configured for the CPU: 16-token pages, a cache sized for the "
                  "work, 16 requests per batch.", ""]
        rows = []
        for model, e in engines.items():
            t = e["tokens_per_s"]
            load = e.get("other_load")
            rows.append([f"{model} ({e['requests']} x {e['new_tokens']}, "
                         f"{e.get('torch_threads', '?')} torch threads)",
                         _fmt(_med(t["ours"])), _fmt(_med(t.get("ours_sharing_the_gil", []))),
                         _fmt(_med(t.get("ours_next_to_a_busy_process", []))),
                         _fmt(_med(t["transformers_cb"])), _fmt(_med(t["padded_generate"])),
                         "n/a" if load is None else f"{load:.0%}"])
        lines += [markdown_table(["model", "ours tokens/s",
                                  f"ours, another thread holding the GIL {GIL_BUSY_MS:g} ms "
                                  f"in {GIL_PERIOD_MS:g}",
                                  "ours, another process busy as long (no GIL shared)",
                                  "transformers CB tokens/s",
                                  "padded generate (static batches) tokens/s",
                                  "other tenants' load"], rows), ""]
        lines += _reading(report)
    if plots:
        lines += [f"![generate plot]({link})" for link in plots] + [""]
    lines += [f"Raw figures: `benchmarks/out/{NAME}.json`."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    cleanup = Cleanup()
    cleanup.install_signal_handlers()
    try:
        report = _run(cfg, cleanup)
    except KeyboardInterrupt as exc:
        print(f"\nbenchmarks generate: interrupted ({exc or 'Ctrl-C'})", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"\nbenchmarks generate: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        cleanup.close()
    print()
    print(results_markdown(report))
    return 0


def _run(cfg: Config, cleanup: Cleanup) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from inferq.embedded import EmbeddedServer

    class Server(EmbeddedServer):
        def command(self) -> list[str]:
            return dying_with_parent(super().command())

    started = time.monotonic()
    log_dir = cfg.out / "logs"
    data_dir = Path(tempfile.mkdtemp(prefix="inferq-bench-generate-"))
    cleanup.on_close("server data", lambda: shutil.rmtree(data_dir, ignore_errors=True))
    server = Server(data_dir)
    machine = machine_info(server_binary=server.binary)
    say(f"generate benchmark: models {cfg.models}, variants {cfg.variants}, "
        f"{cfg.trials} trial(s); {describe_machine(machine)}")
    cleanup.on_close("server", server.stop)
    url = server.start()
    server_pid = server.process.pid if server.process else None
    report: dict[str, Any] = {"scenario": NAME, "command": command_line(), "date": now_utc(),
                              "machine": machine, "config": {**asdict(cfg),
                                                             "out": str(cfg.out),
                                                             "results_md": str(cfg.results_md)},
                              "models": {}}
    sources = {m: _model_source(m, cfg.out) for m in cfg.models}
    if cfg.compare_engines:
        report["engines"] = {}
        for model in cfg.models:
            say(f"{model}: comparing engines in process")
            small = model != "tiny"
            report["engines"][model] = compare_engines(
                sources[model], requests=16 if small else 32, new_tokens=32 if small else 100,
                slots=SLOTS, trials=1 if cfg.quick and small else 3,
                hf_timeout_s=120 if small else 60, threads=TORCH_THREADS[model])
    for model in cfg.models:
        tokenizer = AutoTokenizer.from_pretrained(sources[model])
        items = workload(tokenizer, cfg.requests[model], cfg.rate[model], cfg.seed)
        warm = workload(tokenizer, WARMUP, cfg.rate[model], cfg.seed + 99)
        offered = sum(i.max_new for i in items) / items[-1].at_s
        entry: dict[str, Any] = {"requests": len(items), "rate": cfg.rate[model],
                                 "offered_tokens_per_s": offered,
                                 "variants": {v: [] for v in cfg.variants}}
        tokens_of: dict[str, list[list[int]]] = {}
        entry["engine_alone"] = []
        for trial in range(cfg.trials):
            say(f"{model} trial {trial + 1}/{cfg.trials}: the engine alone, in process "
                f"({len(items)} requests at {cfg.rate[model]:g}/s)")
            alone, alone_tokens = engine_alone(sources[model], items, warm,
                                               threads=TORCH_THREADS[model])
            entry["engine_alone"].append(alone)
            tokens_of.setdefault("engine alone", alone_tokens)
            say(f"  {alone['tokens_per_s']:,.0f} tokens/s, TTFT p50 "
                f"{alone['ttft_ms']['p50']:.0f} ms, {alone['steps']} steps "
                f"({alone['admission_steps']} admitting)")
            order = [v for v in ORDERS[trial % len(ORDERS)] if v in cfg.variants]
            for variant in order:
                say(f"{model} trial {trial + 1}/{cfg.trials}: {variant} "
                    f"({len(items)} requests at {cfg.rate[model]:g}/s)")
                stats, tokens = run_variant(cleanup, url, server_pid, model, sources[model],
                                            variant, items, warm, log_dir, trial)
                entry["variants"][variant].append(stats)
                tokens_of.setdefault(variant, tokens)
                say(f"  {stats['tokens_per_s']:,.0f} tokens/s, TTFT p50 "
                    f"{stats['ttft_ms']['p50']:.0f} ms, e2e p50 {stats['e2e_ms']['p50']:.0f} ms, "
                    f"other load {stats['cpu'].get('other_load')}")
        v = entry["variants"]

        def med(variant: str, path: tuple[str, ...], v: dict[str, Any] = v) -> float | None:
            vals = []
            for t in v.get(variant, []):
                x: Any = t
                for p in path:
                    x = x[p]
                vals.append(x)
            return _med(vals)

        ratios: dict[str, float | None] = {}
        cb, req, bs1 = (med(x, ("tokens_per_s",)) for x in VARIANTS)
        if cb and req:
            ratios["tokens_per_s"] = cb / req
            t_cb, t_req = med("continuous", ("ttft_ms", "p50")), med("request",
                                                                     ("ttft_ms", "p50"))
            if t_cb is not None and t_req:
                ratios["ttft_p50"] = t_cb / t_req
        if cb and bs1:
            ratios["vs_bs1"] = cb / bs1
        alone_tps = _med([t["tokens_per_s"] for t in entry["engine_alone"]])
        if cb and alone_tps:
            ratios["vs_engine_alone"] = cb / alone_tps
        entry["ratios"] = ratios
        if "continuous" in tokens_of and len(tokens_of) > 1:
            ref = tokens_of["continuous"]
            same = {k: sum(a == b for a, b in zip(ref, t, strict=True))
                    for k, t in tokens_of.items() if k != "continuous"}
            entry["same_tokens"] = ", ".join(f"{k} {n}/{len(ref)}" for k, n in same.items())
        report["models"][model] = entry
    server.stop()
    report["seconds"] = time.monotonic() - started
    report = json.loads(json.dumps(report, default=str))
    save_report(NAME, report, cfg.out, cfg.results_md,
                plots=lambda folder: draw_plots(report, folder),
                markdown=lambda links, json_path: results_markdown(report, links))
    return report
