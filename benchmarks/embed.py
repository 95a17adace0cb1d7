"""Scenario ``embed``: MiniLM sentence embeddings through the full stack vs the bare model.

Three variants, measured side by side in one run, on the same sentences:

* **limit** -- the bare model in this process (``AutoTokenizer``/``AutoModel``, mean pooling
  and L2 normalisation exactly as the worker does them, ``torch.inference_mode``), batches of
  1, 8, 16, 32 and 64 in arrival order, tokenization included. The best batch size is "the
  limit". As a footnote, batches of 32 after sorting *all* sentences by length (what
  ``SentenceTransformer.encode`` does) show what padding costs.
* **full** -- an embedded Redis-compatible server with its default AOF, a worker started as
  ``python -m inferq worker --model minilm --device cpu`` with default flags, and an
  ``AsyncClient`` producer that enqueues every request in chunks and awaits the results with
  a few concurrent waiters (in enqueue order, so the producer does not steal the CPU the
  worker needs). Throughput = N / (last result seen - first enqueue).
* **bs1** -- the same worker with ``--max-batch-size 1`` (on its own queue, ``minilm-bs1``,
  so the two workers never share requests or tuned state).

Both workers start once and are warmed up (the adaptive window learns its latency model),
then every trial runs the three variants in a rotated order, so slow drift of a noisy machine
spreads over all of them. Ratios are computed per trial and summarised by their median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import corpus
from benchmarks.framework import (
    ByMode,
    Run,
    Scenario,
    int_list,
    noise_of,
    positive_int,
)
from benchmarks.harness import (
    Cleanup,
    CpuProbe,
    describe_machine,
    fmt_range,
    markdown_table,
    percentiles,
    say,
    stop_child,
    summary,
    verdict,
)
from benchmarks.models import BareModel, minilm_path
from benchmarks.stack import (
    WorkerProc,
    enqueue_and_await,
    load_str,
    scaled,
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
VARIANT_ORDERS = (("limit", "full", "bs1"), ("full", "bs1", "limit"), ("bs1", "limit", "full"))


@dataclass(frozen=True)
class EmbedConfig:
    requests: int
    batch_sizes: tuple[int, ...]
    warmup: int
    chunk: int
    waiters: int
    ready_timeout_s: float = 300.0

    @property
    def result_timeout_s(self) -> float:
        return max(120.0, self.requests / 5)


def start_workers(cleanup: Cleanup, url: str, log_dir: Path, tag: str, *, bs1: bool = True
                  ) -> dict[str, WorkerProc]:
    """The default MiniLM worker (``full``) and, with ``bs1``, the same at
    ``--max-batch-size 1`` on its own queue; ``embed`` and ``embed-load`` measure both."""
    workers = {"full": spawn_worker(cleanup, url, model_arg=FULL_MODEL,
                                    worker_id=f"bench-{tag}-full", log_dir=log_dir,
                                    flags=["--device", "cpu"], log_level="INFO")}
    if bs1:
        workers["bs1"] = spawn_worker(cleanup, url, model_arg=f"{BS1_MODEL}={minilm_path()}",
                                      worker_id=f"bench-{tag}-bs1", log_dir=log_dir,
                                      flags=["--device", "cpu", "--max-batch-size", "1"],
                                      log_level="INFO")
    return workers


# --------------------------------------------------------------------------- bare model


@dataclass
class LimitTrial:
    per_batch_size: dict[int, float]
    per_cpu_second: dict[int, float]  # requests per CPU-second of this process
    other_load: dict[int, float | None]  # share of the machine other tenants used meanwhile
    padding_efficiency: dict[int, float]
    sorted_throughput: float
    sorted_padding_efficiency: float
    seconds: float


def run_limit(bare: BareModel, texts: Sequence[str], batch_sizes: Sequence[int],
              real_tokens: int, probe: CpuProbe) -> tuple[LimitTrial, torch.Tensor]:
    """One pass over ``texts`` per batch size; returns the embeddings of the smallest batch
    size's pass (the reference the full stack's outputs are checked against). ``probe``
    watches this process (``bench``) and the other processes the benchmark started."""
    started = time.perf_counter()
    per_bs: dict[int, float] = {}
    per_cpu: dict[int, float] = {}
    other: dict[int, float | None] = {}
    padding: dict[int, float] = {}
    reference = None
    for bs in batch_sizes:
        probe.start()
        t0 = time.perf_counter()
        vectors, padded = bare.encode(texts, bs)
        per_bs[bs] = len(texts) / (time.perf_counter() - t0)
        cpu = probe.stop()
        per_cpu[bs] = len(texts) / max(cpu["bench"] or 0.0, 1e-3)
        other[bs] = cpu["other_load"]
        padding[bs] = real_tokens / padded
        if reference is None:
            reference = vectors
        say(f"  limit bs={bs:<3} {per_bs[bs]:7.1f} req/s  (padding efficiency {padding[bs]:.2f}"
            f", other load {load_str(other[bs])})")
    ordered = sorted(texts, key=len)
    t0 = time.perf_counter()
    _, padded = bare.encode(ordered, SORTED_BATCH_SIZE)
    sorted_tput = len(texts) / (time.perf_counter() - t0)
    say(f"  limit bs={SORTED_BATCH_SIZE} sorted by length {sorted_tput:7.1f} req/s "
        f"(padding efficiency {real_tokens / padded:.2f})")
    assert reference is not None
    return LimitTrial(per_bs, per_cpu, other, padding, sorted_tput, real_tokens / padded,
                      time.perf_counter() - started), reference


# --------------------------------------------------------------------------- full stack


@dataclass
class StackTrial:
    throughput: float
    seconds: float
    enqueue_seconds: float
    total_ms: dict[str, float | None]
    queue_wait_ms: dict[str, float | None]
    mean_batch_size_per_request: float
    batches: int
    mean_batch_size_per_batch: float
    batch_sizes: dict[int, int]
    forward_seconds: float
    forward_throughput: float
    busy_fraction: float
    padding_efficiency: float
    retried: int
    max_abs_diff_vs_bare: float
    min_cosine_vs_bare: float
    cpu_seconds: dict[str, float | None]
    requests_per_cpu_second: float | None
    other_load: float | None
    window: dict[str, Any] = field(default_factory=dict)
    window_delta: dict[str, Any] = field(default_factory=dict)


def _per_cpu(n: int, cpu: Mapping[str, float | None]) -> float | None:
    """Requests per CPU-second of the stack: worker + server + producer."""
    parts = [cpu.get(name) for name in ("worker", "server", "producer")]
    if any(p is None for p in parts):
        return None
    total = sum(p for p in parts if p is not None)
    return n / total if total > 0 else None


def _read_window(url: str, worker: WorkerProc, *, expected: int, timeout_s: float = 8.0
                 ) -> dict[str, Any]:
    """The worker's published window stats once they include ``expected`` requests (the
    worker publishes when it goes idle and every couple of seconds)."""
    import redis

    from inferq.stats import read_window

    keys = worker.keys
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            fields = read_window(client, keys, worker.worker_id)
            if int(fields.get("requests", 0)) >= expected or time.monotonic() > deadline:
                return fields
            time.sleep(0.1)
    finally:
        client.close()


def _window_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for name in ("batches", "requests", "failed", "refused"):
        delta[name] = int(after.get(name, 0)) - int(before.get(name, 0))
    for name in ("forward_s", "handoff_s"):
        delta[name] = round(float(after.get(name, 0)) - float(before.get(name, 0)), 6)
    delta["handoffs"] = int(after.get("handoffs", 0)) - int(before.get("handoffs", 0))
    if delta["handoffs"]:
        # Model idle between a forward and the next while claimed requests waited: the
        # next window was decoded and tokenized during the forward; this is what remains.
        delta["handoff_ms_mean"] = round(delta["handoff_s"] / delta["handoffs"] * 1e3, 3)
    for name in ("reasons", "sizes"):
        a, b = Counter(after.get(name, {})), Counter(before.get(name, {}))
        delta[name] = {k: v for k, v in sorted((a - b).items())}
    if delta["batches"]:
        delta["mean_batch_size"] = round(delta["requests"] / delta["batches"], 3)
    return delta


def _handoff(delta: Mapping[str, Any]) -> str:
    if not delta.get("handoffs"):
        return ""
    return (f"model idle between batches with work waiting {delta['handoff_ms_mean']:.2f} ms "
            f"x {delta['handoffs']}; ")


def run_stack_trial(url: str, worker: WorkerProc, variant: str, texts: Sequence[str],
                    tokens: Sequence[int], reference: torch.Tensor, cfg: EmbedConfig,
                    probe: CpuProbe, sent: dict[str, int]) -> StackTrial:
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

    # Reconstruct the batches from the results: one forward pass = one (finished, compute) pair.
    batches: dict[tuple[int | None, float | None], list[int]] = {}
    for index, r in enumerate(results):
        batches.setdefault((r.finished_ms, r.compute_ms), []).append(index)
    forward_s = sum((key[1] or 0.0) for key in batches) / 1e3
    real = sum(tokens)
    padded = sum(len(rows) * max(tokens[i] for i in rows) for rows in batches.values())
    sizes = Counter(len(rows) for rows in batches.values())

    vectors = torch.tensor([r.output for r in results], dtype=torch.float32)
    diff = float((vectors - reference).abs().max())
    cosine = float((vectors * reference).sum(dim=1).min())
    total = [r.total_ms for r in results if r.total_ms is not None]
    wait = [r.queue_wait_ms for r in results if r.queue_wait_ms is not None]
    trial = StackTrial(
        throughput=len(results) / seconds,
        seconds=seconds,
        enqueue_seconds=enqueue_seconds,
        total_ms=percentiles(total),
        queue_wait_ms=percentiles(wait),
        mean_batch_size_per_request=statistics.fmean(r.batch_size or 0 for r in results),
        batches=len(batches),
        mean_batch_size_per_batch=len(results) / len(batches),
        batch_sizes=dict(sorted(sizes.items())),
        forward_seconds=forward_s,
        forward_throughput=len(results) / forward_s if forward_s else 0.0,
        busy_fraction=forward_s / seconds,
        padding_efficiency=real / padded if padded else 1.0,
        retried=sum(1 for r in results if r.attempts > 1),
        max_abs_diff_vs_bare=diff,
        min_cosine_vs_bare=cosine,
        cpu_seconds={k: v for k, v in cpu.items() if k != "other_load"},
        requests_per_cpu_second=_per_cpu(len(results), cpu),
        other_load=cpu["other_load"],
        window=dict(after),
        window_delta=_window_delta(before, after),
    )
    say(f"  {variant:<5} {trial.throughput:7.1f} req/s  in {seconds:.2f} s "
        f"(enqueue {enqueue_seconds:.2f} s); batch mean {trial.mean_batch_size_per_batch:.1f}, "
        f"{trial.batches} batches; model busy {trial.busy_fraction:.0%}, "
        f"forward-only {trial.forward_throughput:.1f} req/s; "
        f"{_handoff(trial.window_delta)}p50 total {trial.total_ms['p50']:.0f} ms; "
        f"other load {load_str(trial.other_load)}")
    return trial


# ------------------------------------------------------------------------------ reports


def figures(cfg: EmbedConfig, texts: Sequence[str], tokens: Sequence[int],
            limit_trials: Sequence[LimitTrial], stack_trials: Mapping[str, Sequence[StackTrial]],
            final_windows: Mapping[str, Any], exit_codes: Mapping[str, int | None]
            ) -> dict[str, Any]:
    per_bs = {bs: summary([t.per_batch_size[bs] for t in limit_trials])
              for bs in cfg.batch_sizes}
    best_bs = max(cfg.batch_sizes, key=lambda bs: per_bs[bs]["median"] or 0.0)
    limit = [t.per_batch_size[best_bs] for t in limit_trials]
    full = [t.throughput for t in stack_trials["full"]]
    bs1 = [t.throughput for t in stack_trials["bs1"]]
    # Paired per trial: the variants of one trial ran back to back on the same machine state.
    full_over_limit = summary([f / lim for f, lim in zip(full, limit, strict=True)])
    full_over_bs1 = summary([f / b for f, b in zip(full, bs1, strict=True)])
    loads = [x for t in limit_trials for x in t.other_load.values()]
    loads += [t.other_load for ts in stack_trials.values() for t in ts]

    def stack(variant: str) -> dict[str, Any]:
        trials = stack_trials[variant]
        rows = [asdict(t) for t in trials]
        return {
            **{key: summarize_trials(rows, [key]) for key in (
                "throughput", "forward_throughput", "busy_fraction",
                "mean_batch_size_per_request", "mean_batch_size_per_batch",
                "padding_efficiency", "other_load", "requests_per_cpu_second")},
            "cpu_seconds_per_1000": {
                name: summary([1000 * c / len(texts) for t in trials
                               if (c := t.cpu_seconds.get(name)) is not None])
                for name in ("worker", "server", "producer", "idle_worker")},
            "total_ms": {q: summary([t.total_ms[q] or 0.0 for t in trials])
                         for q in ("p50", "p90", "p99")},
            "queue_wait_ms": {q: summary([t.queue_wait_ms[q] or 0.0 for t in trials])
                              for q in ("p50", "p90", "p99")},
            "trials": rows,
            "worker_window_final": final_windows.get(variant, {}),
            "worker_exit_code": exit_codes.get(variant),
        }

    return {
        "corpus": {
            "sentences": len(texts), "seed": CORPUS_SEED, "words": [MIN_WORDS, MAX_WORDS],
            "tokens_mean": statistics.fmean(tokens), "tokens_min": min(tokens),
            "tokens_max": max(tokens), "warmup_seed": WARMUP_SEED, "warmup": cfg.warmup,
            "example": texts[0],
        },
        "workers": {
            "full": f"python -m inferq worker --model {FULL_MODEL} --device cpu (defaults)",
            "bs1": f"python -m inferq worker --model {BS1_MODEL}=<minilm path> --device cpu "
                   "--max-batch-size 1",
        },
        "limit": {
            "per_batch_size": {str(bs): s for bs, s in per_bs.items()},
            "per_cpu_second": {str(bs): summary([t.per_cpu_second[bs] for t in limit_trials])
                               for bs in cfg.batch_sizes},
            "other_load": {str(bs): summary([x for t in limit_trials
                                             if (x := t.other_load[bs]) is not None])
                           for bs in cfg.batch_sizes},
            "padding_efficiency": {str(bs): limit_trials[0].padding_efficiency[bs]
                                   for bs in cfg.batch_sizes} if limit_trials else {},
            "best_batch_size": best_bs,
            "throughput": summary(limit),
            "sorted_batch_size": SORTED_BATCH_SIZE,
            "sorted_throughput": summary([t.sorted_throughput for t in limit_trials]),
            "sorted_padding_efficiency": limit_trials[0].sorted_padding_efficiency
            if limit_trials else None,
            "seconds": [t.seconds for t in limit_trials],
        },
        "full": stack("full"),
        "bs1": stack("bs1"),
        "noise": noise_of(loads),
        "ratios": {
            "full_over_limit": {**full_over_limit, "target": TARGET_FULL_OVER_LIMIT,
                                "verdict": verdict(full_over_limit["median"],
                                                    TARGET_FULL_OVER_LIMIT)},
            "full_over_bs1": {**full_over_bs1, "target": TARGET_FULL_OVER_BS1,
                              "verdict": verdict(full_over_bs1["median"],
                                                  TARGET_FULL_OVER_BS1)},
        },
    }


def _ms(s: Mapping[str, Any]) -> str:
    return fmt_range(s, 0)


def _pct(s: Mapping[str, Any]) -> str:
    return fmt_range(scaled(s, 100), 0, "%")


def results_markdown(r: Mapping[str, Any]) -> str:
    lim, full, bs1, ratios = r["limit"], r["full"], r["bs1"], r["ratios"]
    best = lim["best_batch_size"]
    n = r["corpus"]["sentences"]
    rows: list[list[str]] = []
    for bs, s in lim["per_batch_size"].items():
        mark = " **(the limit)**" if int(bs) == best else ""
        rows.append([f"bare model, batch {bs}{mark}", fmt_range(s),
                     f"{lim['padding_efficiency'][bs]:.2f}", "", "", "", ""])
    rows.append([f"bare model, batch {lim['sorted_batch_size']}, all sentences sorted by "
                 "length (footnote)", fmt_range(lim["sorted_throughput"]),
                 f"{lim['sorted_padding_efficiency']:.2f}", "", "", "", ""])
    for label, v in (("**full stack**: server + worker (default flags) + producer", full),
                     ("full stack, worker `--max-batch-size 1`", bs1)):
        rows.append([label, fmt_range(v["throughput"]), fmt_range(v["padding_efficiency"], 2),
                     fmt_range(v["mean_batch_size_per_request"]),
                     f"{_ms(v['total_ms']['p50'])} / {_ms(v['total_ms']['p90'])} / "
                     f"{_ms(v['total_ms']['p99'])}",
                     f"{_ms(v['queue_wait_ms']['p50'])} / {_ms(v['queue_wait_ms']['p99'])}",
                     f"{fmt_range(v['forward_throughput'])}, busy {_pct(v['busy_fraction'])}"])
    table = markdown_table(
        ["variant", "req/s", "padding eff.", "mean batch (per request)",
         "total ms p50 / p90 / p99", "queue wait ms p50 / p99",
         "worker forward-only req/s, model busy"], rows)
    ratio_rows = [
        ["full / limit", fmt_range(ratios["full_over_limit"], 2),
         f">= {ratios['full_over_limit']['target']}", ratios["full_over_limit"]["verdict"]],
        ["full / batch-1 worker", fmt_range(ratios["full_over_bs1"], 2),
         f">= {ratios['full_over_bs1']['target']}", ratios["full_over_bs1"]["verdict"]],
    ]
    cpu = lim["per_cpu_second"]
    cpu_rows = [[f"bare model, batch {bs}", fmt_range(cpu[bs]), "",
                 _pct(lim["other_load"][bs])] for bs in cpu]
    for label, v in (("full stack", full), ("full stack, batch-1 worker", bs1)):
        per = v["cpu_seconds_per_1000"]
        cpu_rows.append([label, fmt_range(v["requests_per_cpu_second"]),
                         " / ".join(fmt_range(per[k], 1) for k in
                                    ("worker", "server", "producer", "idle_worker")),
                         _pct(v["other_load"])])
    cpu_table = markdown_table(
        ["variant", "requests per CPU-second",
         "CPU-s per 1000 requests: worker / server / producer / idle other worker",
         "other tenants' load"], cpu_rows)
    corpus_info = r["corpus"]
    return f"""- Workload: {n} distinct sentences per pass ({corpus_info['tokens_mean']:.1f} tokens on average, {corpus_info['tokens_min']}..{corpus_info['tokens_max']}), the same for every variant; {len(full['throughput']['trials'])} trial(s), variants rotated per trial; median (min..max) over trials.
- Full stack: embedded server with AOF (`appendfsync everysec`), one `python -m inferq worker --model minilm --device cpu` (default flags), `AsyncClient.enqueue_many` in chunks of {r['config']['chunk']}, {r['config']['waiters']} waiters; throughput = N / (last result - first enqueue). Producer, server and worker share the machine's CPUs.

{table}

{markdown_table(["ratio", "median (min..max)", "target", "verdict"], ratio_rows)}

Latencies are for a burst of {n} requests enqueued at once, so they are mostly queueing.
"Forward-only" is N / the worker's summed forward time; "busy" is that time / wall time.
The bare model tokenizes each batch and then runs it, one after the other; the worker
tokenizes the next window on a second thread while the model runs, so full / limit can
exceed 1. Every full-stack output is checked against the bare model's embedding of the same
sentence (worst cosine {min(t['min_cosine_vs_bare'] for t in full['trials']):.6f}).

CPU cost (user + system CPU seconds from /proc; less sensitive than wall time to other load
on the machine, though threads spinning while they wait count too). "Other tenants' load" is
the share of all CPUs that processes not started by this benchmark used during the timed
passes: a clean measurement has it near 0%.

{cpu_table}
"""  # noqa: E501


# ------------------------------------------------------------------------------ scenario


class Embed(Scenario[EmbedConfig]):
    name = "embed"
    title = "MiniLM sentence embeddings, full stack vs the bare model"
    quick_help = "300 requests, 1 trial, short warm-up (< 2 min)"
    config = EmbedConfig
    markdown = staticmethod(results_markdown)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--requests", type=positive_int, default=ByMode(2000, 300),
                            help="requests per full-stack trial and sentences per bare-model "
                                 "pass (default %(default)s)")
        parser.add_argument("--batch-sizes", type=int_list, default=(1, 8, 16, 32, 64),
                            help="bare-model batch sizes, comma-separated (default 1,8,16,32,64)")
        parser.add_argument("--warmup", type=positive_int, default=ByMode(256, 64),
                            help="warm-up requests per variant (default %(default)s)")
        parser.add_argument("--chunk", type=positive_int, default=100,
                            help="requests per enqueue_many call (default 100)")
        parser.add_argument("--waiters", type=positive_int, default=8,
                            help="concurrent result waiters in the producer (default 8)")

    def measure(self, run: Run[EmbedConfig]) -> dict[str, Any]:
        import torch

        cfg = run.cfg
        texts = corpus.sentences(cfg.requests, seed=CORPUS_SEED, min_words=MIN_WORDS,
                                 max_words=MAX_WORDS)
        warm_texts = corpus.sentences(cfg.warmup, seed=WARMUP_SEED, min_words=MIN_WORDS,
                                      max_words=MAX_WORDS)
        say(f"embed benchmark: {cfg.requests} requests x {run.trials} trial(s); "
            f"{describe_machine(run.machine)}; load {run.machine['load_avg_1_5_15']}")
        server, url = run.server()
        spid = server.pid
        # Workers load torch and the model while this process loads its own copy.
        workers = start_workers(run.cleanup, url, run.log_dir, "embed")

        say("loading the bare model in this process")
        bare = BareModel(minilm_path())
        tokens = bare.token_counts(texts)
        real_tokens = sum(tokens)
        say(f"corpus: {len(texts)} sentences, {statistics.fmean(tokens):.1f} tokens on average "
            f"({min(tokens)}..{max(tokens)}); torch threads {torch.get_num_threads()}")
        for bs in cfg.batch_sizes:
            bare.encode(warm_texts, bs)

        say("waiting for the workers, then warming them up")
        sent = warm_up(url, workers, warm_texts, ready_timeout_s=cfg.ready_timeout_s,
                       timeout_s=cfg.result_timeout_s)

        limit_trials: list[LimitTrial] = []
        stack_trials: dict[str, list[StackTrial]] = {"full": [], "bs1": []}
        reference: torch.Tensor | None = None
        for trial in range(run.trials):
            order = VARIANT_ORDERS[trial % len(VARIANT_ORDERS)]
            say(f"trial {trial + 1}/{run.trials}: {' -> '.join(order)}")
            for variant in order:
                if variant == "limit":
                    probe = CpuProbe({"bench": None, "server": spid,
                                      **{f"{v}_worker": w.pid for v, w in workers.items()}})
                    result, vectors = run_limit(bare, texts, cfg.batch_sizes, real_tokens, probe)
                    limit_trials.append(result)
                    reference = vectors if reference is None else reference
                    continue
                if reference is None:
                    reference = bare.encode(texts, 1)[0]
                other = workers["bs1" if variant == "full" else "full"]
                probe = CpuProbe({"worker": workers[variant].pid, "server": spid,
                                  "producer": None, "idle_worker": other.pid})
                stack_trials[variant].append(run_stack_trial(
                    url, workers[variant], variant, texts, tokens, reference, cfg, probe, sent))

        say("stopping the workers and the server")
        final_windows: dict[str, Any] = {}
        exit_codes: dict[str, int | None] = {}
        for variant, worker in workers.items():
            exit_codes[variant] = stop_child(worker.child)
            final_windows[variant] = _read_window(url, worker, expected=sent[variant],
                                                  timeout_s=0)
        server.stop()
        return figures(cfg, texts, tokens, limit_trials, stack_trials, final_windows,
                       exit_codes)


SCENARIO = Embed()
