"""Scenario ``embed``: MiniLM sentence embeddings through the full stack (server, default worker,
producer) vs the bare model in this process ("the limit") vs a batch-1 worker, side by side on
the same sentences; the method is in benchmarks/README.md.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import corpus
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
    CpuProbe,
    describe_machine,
    percentiles,
    positive_int,
    say,
    stop_child,
    summary,
    verdict,
)
from benchmarks.models import BareModel, minilm_path
from benchmarks.stack import (
    WorkerProc,
    batch_groups,
    batches_of,
    enqueue_and_await,
    load_str,
    spawn_worker,
    summarize_trials,
    warm_up,
)

if TYPE_CHECKING:
    import torch

FULL_MODEL = "minilm"
BS1_MODEL = "minilm-bs1"
TARGET_FULL_OVER_LIMIT = 0.85
TARGET_FULL_OVER_BS1 = 2.0
CORPUS_SEED = 20240601
WARMUP_SEED = 7
#: Word counts 13..45 give ~33 WordPiece tokens per sentence on average (16..53) with this
#: vocabulary, the sentence length the design notes' reference figures were measured at.
MIN_WORDS, MAX_WORDS = 13, 45
SORTED_BATCH_SIZE = 32


@dataclass(frozen=True)
class EmbedConfig:
    requests: int = flag(positive_int, ByMode(2000, 300), "requests per full-stack trial and "
                         "sentences per bare-model pass")
    batch_sizes: tuple[int, ...] = flag(int_list, "1,8,16,32,64", "bare-model batch sizes, "
                                        "comma-separated")
    warmup: int = flag(positive_int, ByMode(256, 64), "warm-up requests per variant")
    chunk: int = flag(positive_int, 100, "requests per enqueue_many call")
    waiters: int = flag(positive_int, 8, "concurrent result waiters in the producer")
    ready_timeout_s: float = 300.0

    @property
    def result_timeout_s(self) -> float:
        return max(120.0, self.requests / 5)


def start_workers(cleanup: Cleanup, url: str, log_dir: Path, tag: str, *, bs1: bool = True
                  ) -> dict[str, WorkerProc]:
    """The default MiniLM worker (``full``) and, with ``bs1``, the same at
    ``--max-batch-size 1`` on its own queue; ``embed`` and ``embed-load`` measure both."""
    return {variant: spawn_worker(cleanup, url, model_arg=model, worker_id=f"bench-{tag}-"
                                  f"{variant}", log_dir=log_dir, log_level="INFO",
                                  flags=["--device", "cpu", *extra])
            for variant, model, extra in (
                ("full", FULL_MODEL, []),
                *([("bs1", f"{BS1_MODEL}={minilm_path()}", ["--max-batch-size", "1"])]
                  if bs1 else []))}


def run_limit(bare: BareModel, texts: Sequence[str], batch_sizes: Sequence[int],
              real_tokens: int, probe: CpuProbe) -> tuple[dict[str, Any], torch.Tensor]:
    """One pass over ``texts`` per batch size, then all of them sorted by length at
    ``SORTED_BATCH_SIZE`` (the padding footnote); returns the figures and the first pass's
    embeddings (the reference the full stack's outputs are checked against). ``probe``
    watches this process (``bench``) and the other processes the benchmark started."""
    started = time.perf_counter()
    t: dict[str, Any] = {k: {} for k in ("per_batch_size", "per_cpu_second", "other_load",
                                         "padding_efficiency")}
    reference = None
    for bs in batch_sizes:
        probe.start()
        t0 = time.perf_counter()
        vectors, padded = bare.encode(texts, bs)
        t["per_batch_size"][bs] = len(texts) / (time.perf_counter() - t0)
        cpu = probe.stop()
        t["per_cpu_second"][bs] = len(texts) / max(cpu["bench"] or 0.0, 1e-3)
        t["other_load"][bs] = cpu["other_load"]
        t["padding_efficiency"][bs] = real_tokens / padded
        reference = vectors if reference is None else reference
        say(f"  limit bs={bs:<3} {t['per_batch_size'][bs]:7.1f} req/s  (padding efficiency "
            f"{real_tokens / padded:.2f}, other load {load_str(cpu['other_load'])})")
    t0 = time.perf_counter()
    _, padded = bare.encode(sorted(texts, key=len), SORTED_BATCH_SIZE)
    t["sorted_throughput"] = len(texts) / (time.perf_counter() - t0)
    t["sorted_padding_efficiency"] = real_tokens / padded
    say(f"  limit bs={SORTED_BATCH_SIZE} sorted by length {t['sorted_throughput']:7.1f} req/s "
        f"(padding efficiency {real_tokens / padded:.2f})")
    t["seconds"] = time.perf_counter() - started
    assert reference is not None
    return t, reference


def _read_window(url: str, worker: WorkerProc, *, expected: int, timeout_s: float = 8.0
                 ) -> dict[str, Any]:
    """The worker's published window stats once they include ``expected`` requests (the
    worker publishes when it goes idle and every couple of seconds)."""
    import redis

    from inferq.stats import read_window

    with redis.Redis.from_url(url) as client:
        deadline = time.monotonic() + timeout_s
        while True:
            fields = read_window(client, worker.keys, worker.worker_id)
            if int(fields.get("requests", 0)) >= expected or time.monotonic() > deadline:
                return fields
            time.sleep(0.1)


def _window_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    def diff(name: str, kind: type = int) -> Any:
        return kind(after.get(name, 0)) - kind(before.get(name, 0))

    delta: dict[str, Any] = {k: diff(k) for k in ("batches", "requests", "failed", "refused")}
    delta.update({k: round(diff(k, float), 6) for k in ("forward_s", "handoff_s")})
    delta["handoffs"] = diff("handoffs")
    if delta["handoffs"]:
        # Model idle between a forward and the next while claimed requests waited: the
        # next window was decoded and tokenized during the forward; this is what remains.
        delta["handoff_ms_mean"] = round(delta["handoff_s"] / delta["handoffs"] * 1e3, 3)
    for name in ("reasons", "sizes"):
        delta[name] = dict(sorted((Counter(after.get(name, {}))
                                   - Counter(before.get(name, {}))).items()))
    if delta["batches"]:
        delta["mean_batch_size"] = round(delta["requests"] / delta["batches"], 3)
    return delta


def run_stack_trial(url: str, worker: WorkerProc, variant: str, texts: Sequence[str],
                    tokens: Sequence[int], reference: torch.Tensor, cfg: EmbedConfig,
                    probe: CpuProbe, sent: dict[str, int]) -> dict[str, Any]:
    """One timed pass through the full stack. ``probe`` measures the CPU seconds of the
    worker, the server, this process (the producer) and the idle other worker meanwhile."""
    import torch

    before = _read_window(url, worker, expected=sent[variant])
    probe.start()
    results, seconds, enqueue_seconds = asyncio.run(enqueue_and_await(
        url, worker.model, texts, cfg.chunk, [worker], cfg.result_timeout_s, cfg.waiters))
    cpu = probe.stop()
    sent[variant] += len(texts)
    after = _read_window(url, worker, expected=sent[variant])
    batches = batch_groups(results)
    forward_s = sum((key[2] or 0.0) for key in batches) / 1e3
    padded = sum(len(rows) * max(tokens[i] for i in rows) for rows in batches.values())
    vectors = torch.tensor([r.output for r in results], dtype=torch.float32)
    parts = [cpu.get(name) for name in ("worker", "server", "producer")]
    cpu_total = sum(p for p in parts if p is not None)
    n = len(results)
    t = {
        "throughput": n / seconds, "seconds": seconds, "enqueue_seconds": enqueue_seconds,
        "total_ms": percentiles([r.total_ms for r in results if r.total_ms is not None]),
        "queue_wait_ms": percentiles([r.queue_wait_ms for r in results
                                      if r.queue_wait_ms is not None]),
        "mean_batch_size_per_request": statistics.fmean(r.batch_size or 0 for r in results),
        "batches": len(batches), "mean_batch_size_per_batch": n / len(batches),
        "batch_sizes": dict(sorted(batches_of(results).items())),
        "forward_seconds": forward_s, "forward_throughput": n / forward_s if forward_s else 0.0,
        "busy_fraction": forward_s / seconds,
        "padding_efficiency": sum(tokens) / padded if padded else 1.0,
        "retried": sum(1 for r in results if r.attempts > 1),
        "max_abs_diff_vs_bare": float((vectors - reference).abs().max()),
        "min_cosine_vs_bare": float((vectors * reference).sum(dim=1).min()),
        "cpu_seconds": {k: v for k, v in cpu.items() if k != "other_load"},
        # requests per CPU-second of the stack: worker + server + producer
        "requests_per_cpu_second": None if None in parts or cpu_total <= 0 else n / cpu_total,
        "other_load": cpu["other_load"], "window": dict(after),
        "window_delta": _window_delta(before, after)}
    d = t["window_delta"]
    handoff = (f"model idle between batches with work waiting {d['handoff_ms_mean']:.2f} ms "
               f"x {d['handoffs']}; " if d.get("handoffs") else "")
    say(f"  {variant:<5} {t['throughput']:7.1f} req/s  in {seconds:.2f} s (enqueue "
        f"{enqueue_seconds:.2f} s); batch mean {t['mean_batch_size_per_batch']:.1f}, "
        f"{t['batches']} batches; model busy {t['busy_fraction']:.0%}, forward-only "
        f"{t['forward_throughput']:.1f} req/s; {handoff}p50 total {t['total_ms']['p50']:.0f} "
        f"ms; other load {load_str(t['other_load'])}")
    return t


def figures(cfg: EmbedConfig, texts: Sequence[str], tokens: Sequence[int],
            limit_trials: Sequence[Mapping[str, Any]],
            stack_trials: Mapping[str, Sequence[Mapping[str, Any]]],
            final_windows: Mapping[str, Any], exit_codes: Mapping[str, int | None]
            ) -> dict[str, Any]:
    def per_bs(key: str) -> dict[str, Any]:
        return {str(bs): summary([x for t in limit_trials if (x := t[key][bs]) is not None])
                for bs in cfg.batch_sizes}

    limit = per_bs("per_batch_size")
    best_bs = max(cfg.batch_sizes, key=lambda bs: limit[str(bs)]["median"] or 0.0)
    throughputs = {v: [t["throughput"] for t in stack_trials[v]] for v in ("full", "bs1")}
    best = [t["per_batch_size"][best_bs] for t in limit_trials]
    loads = [x for t in limit_trials for x in t["other_load"].values()]
    loads += [t["other_load"] for ts in stack_trials.values() for t in ts]

    def stack(variant: str) -> dict[str, Any]:
        rows = [dict(t) for t in stack_trials[variant]]
        return {
            **{key: summarize_trials(rows, [key]) for key in (
                "throughput", "forward_throughput", "busy_fraction",
                "mean_batch_size_per_request", "mean_batch_size_per_batch",
                "padding_efficiency", "other_load", "requests_per_cpu_second")},
            "cpu_seconds_per_1000": {name: summary(
                [1000 * c / len(texts) for t in rows if (c := t["cpu_seconds"].get(name))
                 is not None]) for name in ("worker", "server", "producer", "idle_worker")},
            **{key: {q: summary([t[key][q] or 0.0 for t in rows]) for q in ("p50", "p90", "p99")}
               for key in ("total_ms", "queue_wait_ms")},
            "trials": rows, "worker_window_final": final_windows.get(variant, {}),
            "worker_exit_code": exit_codes.get(variant)}

    def ratio(over: Sequence[float], target: float) -> dict[str, Any]:
        # Paired per trial: the variants of one trial ran back to back on the same machine.
        s = summary([f / o for f, o in zip(throughputs["full"], over, strict=True)])
        return {**s, "target": target, "verdict": verdict(s["median"], target)}

    first = limit_trials[0] if limit_trials else None
    return {
        "corpus": {"sentences": len(texts), "seed": CORPUS_SEED, "words": [MIN_WORDS, MAX_WORDS],
                   "tokens_mean": statistics.fmean(tokens), "tokens_min": min(tokens),
                   "tokens_max": max(tokens), "warmup_seed": WARMUP_SEED,
                   "warmup": cfg.warmup, "example": texts[0]},
        "workers": {
            "full": f"python -m inferq worker --model {FULL_MODEL} --device cpu (defaults)",
            "bs1": f"python -m inferq worker --model {BS1_MODEL}=<minilm path> --device cpu "
                   "--max-batch-size 1"},
        "limit": {
            "per_batch_size": limit, "per_cpu_second": per_bs("per_cpu_second"),
            "other_load": per_bs("other_load"),
            "padding_efficiency": {str(bs): first["padding_efficiency"][bs]
                                   for bs in cfg.batch_sizes} if first else {},
            "best_batch_size": best_bs, "throughput": summary(best),
            "sorted_batch_size": SORTED_BATCH_SIZE,
            "sorted_throughput": summary([t["sorted_throughput"] for t in limit_trials]),
            "sorted_padding_efficiency": first["sorted_padding_efficiency"] if first else None,
            "seconds": [t["seconds"] for t in limit_trials]},
        "full": stack("full"), "bs1": stack("bs1"), "noise": noise_of(loads),
        "ratios": {"full_over_limit": ratio(best, TARGET_FULL_OVER_LIMIT),
                   "full_over_bs1": ratio(throughputs["bs1"], TARGET_FULL_OVER_BS1)}}


def results_markdown(r: Mapping[str, Any]) -> str:
    lim, full = r["limit"], r["full"]
    return render(
        "embed", r, trials=len(full["throughput"]["trials"]),
        cosine=min(t["min_cosine_vs_bare"] for t in full["trials"]),
        limit_rows=render_rows("embed.limit", (
            {"bs": bs, "rate": s, "padding": lim["padding_efficiency"][bs],
             "best": " **(the limit)**" if int(bs) == lim["best_batch_size"] else ""}
            for bs, s in lim["per_batch_size"].items())),
        cpu_rows=render_rows("embed.cpu", ({"bs": bs, "rate": s, "load": lim["other_load"][bs]}
                                           for bs, s in lim["per_cpu_second"].items())))


class Embed(Scenario[EmbedConfig]):
    name = "embed"
    title = "MiniLM sentence embeddings, full stack vs the bare model"
    quick_help = "300 requests, 1 trial, short warm-up (< 2 min)"
    config = EmbedConfig
    markdown = staticmethod(results_markdown)

    def measure(self, run: Run[EmbedConfig]) -> dict[str, Any]:
        import torch

        cfg = run.cfg
        texts, warm_texts = (corpus.sentences(n, seed=seed, min_words=MIN_WORDS,
                                              max_words=MAX_WORDS)
                             for n, seed in ((cfg.requests, CORPUS_SEED),
                                             (cfg.warmup, WARMUP_SEED)))
        say(f"embed benchmark: {cfg.requests} requests x {run.trials} trial(s); "
            f"{describe_machine(run.machine)}; load {run.machine['load_avg_1_5_15']}")
        server, url = run.server()
        # Workers load torch and the model while this process loads its own copy.
        workers = start_workers(run.cleanup, url, run.log_dir, "embed")
        say("loading the bare model in this process")
        bare = BareModel(minilm_path())
        tokens = bare.token_counts(texts)
        say(f"corpus: {len(texts)} sentences, {statistics.fmean(tokens):.1f} tokens on average "
            f"({min(tokens)}..{max(tokens)}); torch threads {torch.get_num_threads()}")
        for bs in cfg.batch_sizes:
            bare.encode(warm_texts, bs)
        say("waiting for the workers, then warming them up")
        sent = warm_up(url, workers, warm_texts, ready_timeout_s=cfg.ready_timeout_s,
                       timeout_s=cfg.result_timeout_s)
        limit_trials: list[dict[str, Any]] = []
        stack_trials: dict[str, list[dict[str, Any]]] = {"full": [], "bs1": []}
        reference: torch.Tensor | None = None
        for _, order in run.rotations(["limit", "full", "bs1"]):
            for variant in order:
                if variant == "limit":
                    probe = CpuProbe({"bench": None, "server": server.pid,
                                      **{f"{v}_worker": w.pid for v, w in workers.items()}})
                    result, vectors = run_limit(bare, texts, cfg.batch_sizes, sum(tokens),
                                                probe)
                    limit_trials.append(result)
                    reference = vectors if reference is None else reference
                    continue
                if reference is None:
                    reference = bare.encode(texts, 1)[0]
                other = workers["bs1" if variant == "full" else "full"]
                probe = CpuProbe({"worker": workers[variant].pid, "server": server.pid,
                                  "producer": None, "idle_worker": other.pid})
                stack_trials[variant].append(run_stack_trial(
                    url, workers[variant], variant, texts, tokens, reference, cfg, probe, sent))
        say("stopping the workers and the server")
        codes = {v: stop_child(w.child) for v, w in workers.items()}
        final = {v: _read_window(url, w, expected=sent[v], timeout_s=0)  # published at exit
                 for v, w in workers.items()}
        server.stop()
        return figures(cfg, texts, tokens, limit_trials, stack_trials, final, codes)


SCENARIO = Embed()
