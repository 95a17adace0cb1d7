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
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import corpus
from benchmarks.harness import (
    Child,
    Cleanup,
    CpuProbe,
    command_line,
    describe_machine,
    dying_with_parent,
    fmt_range,
    machine_info,
    markdown_table,
    now_utc,
    percentile,
    say,
    stop_child,
    summary,
    update_results_md,
    write_json,
)
from benchmarks.stack import BenchmarkFailed, run_reported

if TYPE_CHECKING:
    import torch

    from inferq.embedded import EmbeddedServer
    from inferq.producer.aio import AsyncClient, AsyncHandle
    from inferq.protocol.codec import Result

NAME = "embed"
FULL_MODEL = "minilm"
BS1_MODEL = "minilm-bs1"
FULL_WORKER = "bench-embed-full"
BS1_WORKER = "bench-embed-bs1"
TARGET_FULL_OVER_LIMIT = 0.85
TARGET_FULL_OVER_BS1 = 2.0
CORPUS_SEED = 20240601
WARMUP_SEED = 7
#: Word counts 13..45 give ~33 WordPiece tokens per sentence on average (16..53) with this
#: vocabulary, the sentence length the design notes' reference figures were measured at.
MIN_WORDS, MAX_WORDS = 13, 45
SORTED_BATCH_SIZE = 32
#: A measurement during which other processes used more than this share of the machine is
#: flagged as disturbed.
DISTURBED_LOAD = 0.10
VARIANT_ORDERS = (("limit", "full", "bs1"), ("full", "bs1", "limit"), ("bs1", "limit", "full"))


@dataclass(frozen=True)
class EmbedConfig:
    requests: int
    trials: int
    batch_sizes: tuple[int, ...]
    warmup: int
    chunk: int
    waiters: int
    quick: bool
    out: Path
    results_md: Path | None
    ready_timeout_s: float = 300.0

    @property
    def result_timeout_s(self) -> float:
        return max(120.0, self.requests / 5)


# ---------------------------------------------------------------------------- arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 300 requests, 1 trial, short warm-up (< 2 min)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per full-stack trial and sentences per bare-model "
                             "pass (default 2000; 300 with --quick)")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per variant (default 3; 1 with --quick)")
    parser.add_argument("--batch-sizes", default="1,8,16,32,64",
                        help="bare-model batch sizes, comma-separated (default 1,8,16,32,64)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up requests per variant (default 256; 64 with --quick)")
    parser.add_argument("--chunk", type=int, default=100,
                        help="requests per enqueue_many call (default 100)")
    parser.add_argument("--waiters", type=int, default=8,
                        help="concurrent result waiters in the producer (default 8)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out",
                        help="folder for embed.json and worker logs (default benchmarks/out)")
    parser.add_argument("--results-md", type=Path, default=Path(__file__).parent / "RESULTS.md",
                        help="RESULTS.md to update (default benchmarks/RESULTS.md)")
    parser.add_argument("--no-results-md", action="store_true",
                        help="do not touch RESULTS.md")


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def config_from_args(args: argparse.Namespace) -> EmbedConfig:
    def positive(name: str, value: int) -> int:
        if value < 1:
            raise SystemExit(f"benchmarks embed: --{name} must be >= 1, got {value}")
        return value

    try:
        batch_sizes = tuple(sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()}))
    except ValueError:
        raise SystemExit(f"benchmarks embed: --batch-sizes must be integers, "
                         f"got {args.batch_sizes!r}") from None
    if not batch_sizes or min(batch_sizes) < 1:
        raise SystemExit(f"benchmarks embed: bad --batch-sizes {args.batch_sizes!r}")
    quick = bool(args.quick)
    return EmbedConfig(
        requests=positive("requests", _default(args.requests, 300 if quick else 2000)),
        trials=positive("trials", _default(args.trials, 1 if quick else 3)),
        batch_sizes=batch_sizes,
        warmup=positive("warmup", _default(args.warmup, 64 if quick else 256)),
        chunk=positive("chunk", args.chunk),
        waiters=positive("waiters", args.waiters),
        quick=quick,
        out=args.out,
        results_md=None if args.no_results_md else args.results_md,
    )


# --------------------------------------------------------------------------- bare model


class BareModel:
    """MiniLM the way a user without inferq would run it, pooled exactly like the worker."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        self.max_length = _max_seq_length(path, int(self.tokenizer.model_max_length))

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        return [len(row) for row in ids["input_ids"]]

    def encode(self, texts: Sequence[str], batch_size: int) -> tuple[torch.Tensor, int]:
        """Embeddings of ``texts`` in order, and the padded tokens the batches cost."""
        import torch

        from inferq.worker.models.embedding import mean_pool

        out: list[torch.Tensor] = []
        padded = 0
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                enc = self.tokenizer(list(texts[start:start + batch_size]), padding=True,
                                     truncation=True, max_length=self.max_length,
                                     return_attention_mask=True, return_token_type_ids=False,
                                     return_tensors="pt")
                mask = enc["attention_mask"]
                hidden = self.model(input_ids=enc["input_ids"],
                                    attention_mask=mask).last_hidden_state
                out.append(mean_pool(hidden, mask))
                padded += int(mask.numel())
        return torch.cat(out), padded


def _max_seq_length(path: str, tokenizer_limit: int) -> int:
    config = Path(path) / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    return tokenizer_limit


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
            f", other load {_load(other[bs])})")
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
class Worker:
    variant: str
    model: str
    worker_id: str
    child: Child
    sent: int = 0  # requests this worker has been given so far (warm-up included)


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


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def _per_cpu(n: int, cpu: Mapping[str, float | None]) -> float | None:
    """Requests per CPU-second of the stack: worker + server + producer."""
    parts = [cpu.get(name) for name in ("worker", "server", "producer")]
    if any(p is None for p in parts):
        return None
    total = sum(p for p in parts if p is not None)
    return n / total if total > 0 else None


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


def start_worker(cleanup: Cleanup, url: str, variant: str, log_dir: Path) -> Worker:
    from inferq.worker.models.registry import minilm_path

    if variant == "full":
        model, worker_id, extra = FULL_MODEL, FULL_WORKER, []
        model_arg = FULL_MODEL
    else:
        model, worker_id, extra = BS1_MODEL, BS1_WORKER, ["--max-batch-size", "1"]
        model_arg = f"{BS1_MODEL}={minilm_path()}"
    argv = [sys.executable, "-m", "inferq", "worker", "--redis-url", url, "--model", model_arg,
            "--device", "cpu", "--worker-id", worker_id, *extra]
    child = cleanup.spawn(f"worker {variant}", argv, log_path=log_dir / f"embed-{variant}.log")
    return Worker(variant, model, worker_id, child)


async def _await_result(handle: AsyncHandle, worker: Worker, timeout_s: float) -> Result:
    """Await one result, failing fast (with the worker's log) if the worker process dies."""
    from inferq.errors import ResultTimeout

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await handle.result(timeout=1.0)
        except ResultTimeout:
            if not worker.child.alive():
                raise BenchmarkFailed(
                    f"worker {worker.variant} exited with code "
                    f"{worker.child.process.returncode}:\n{worker.child.log_tail()}") from None
            if time.monotonic() > deadline:
                raise BenchmarkFailed(
                    f"worker {worker.variant}: no result within {timeout_s:.0f} s\n"
                    f"{worker.child.log_tail()}") from None


async def warm_up(url: str, workers: Sequence[Worker], texts: Sequence[str],
                  cfg: EmbedConfig) -> None:
    """Wait until each worker answers one request (model loaded), then send it a burst, so
    torch has seen the shapes and the adaptive window has fitted its latency model."""
    from inferq.producer.aio import AsyncClient

    async with AsyncClient(url) as client:
        async def one(worker: Worker) -> None:
            t0 = time.perf_counter()
            handle = await client.enqueue(texts[0], model=worker.model, task="embed")
            await _await_result(handle, worker, cfg.ready_timeout_s)
            worker.sent += 1
            say(f"  worker {worker.variant} ready after {time.perf_counter() - t0:.1f} s")
            burst = texts if worker.variant == "full" else texts[: max(8, len(texts) // 4)]
            handles = await client.enqueue_many(list(burst), model=worker.model, task="embed")
            for h in handles:
                await _await_result(h, worker, cfg.result_timeout_s)
            worker.sent += len(handles)

        await asyncio.gather(*(one(w) for w in workers))


async def _stack_pass(client: AsyncClient, worker: Worker, texts: Sequence[str],
                      cfg: EmbedConfig) -> tuple[list[Result], float, float]:
    """Enqueue every text in chunks while ``cfg.waiters`` coroutines await the handles in
    enqueue order. Returns the results, the elapsed seconds from the first enqueue to the
    last result, and the seconds the enqueueing took."""
    n = len(texts)
    results: list[Result | None] = [None] * n
    queue: asyncio.Queue[tuple[int, AsyncHandle] | None] = asyncio.Queue()
    last_seen = 0.0
    enqueue_done = 0.0

    async def enqueuer() -> None:
        nonlocal enqueue_done
        for start in range(0, n, cfg.chunk):
            handles = await client.enqueue_many(list(texts[start:start + cfg.chunk]),
                                                model=worker.model, task="embed")
            for offset, handle in enumerate(handles):
                queue.put_nowait((start + offset, handle))
        enqueue_done = time.perf_counter()
        for _ in range(cfg.waiters):
            queue.put_nowait(None)

    async def waiter() -> None:
        nonlocal last_seen
        while (item := await queue.get()) is not None:
            index, handle = item
            results[index] = await _await_result(handle, worker, cfg.result_timeout_s)
            last_seen = max(last_seen, time.perf_counter())

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        group.create_task(enqueuer())
        for _ in range(cfg.waiters):
            group.create_task(waiter())
    done = [r for r in results if r is not None]
    assert len(done) == n
    return done, last_seen - t0, enqueue_done - t0


def _read_window(url: str, worker: Worker, *, expected: int, timeout_s: float = 8.0
                 ) -> dict[str, Any]:
    """The worker's published window stats once they include ``expected`` requests (the
    worker publishes when it goes idle and every couple of seconds)."""
    import redis

    from inferq.protocol.keys import QueueKeys
    from inferq.stats import read_window

    keys = QueueKeys.for_model("embed", worker.model)
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
    delta["forward_s"] = round(float(after.get("forward_s", 0)) -
                               float(before.get("forward_s", 0)), 4)
    for name in ("reasons", "sizes"):
        a, b = Counter(after.get(name, {})), Counter(before.get(name, {}))
        delta[name] = {k: v for k, v in sorted((a - b).items())}
    if delta["batches"]:
        delta["mean_batch_size"] = round(delta["requests"] / delta["batches"], 3)
    return delta


def run_stack_trial(url: str, worker: Worker, texts: Sequence[str], tokens: Sequence[int],
                    reference: torch.Tensor, cfg: EmbedConfig, probe: CpuProbe) -> StackTrial:
    """One timed pass through the full stack. ``probe`` measures the CPU seconds of the
    worker, the server, this process (the producer) and the idle other worker meanwhile."""
    import torch

    from inferq.producer.aio import AsyncClient

    before = _read_window(url, worker, expected=worker.sent)

    async def go() -> tuple[list[Result], float, float]:
        async with AsyncClient(url) as client:
            return await _stack_pass(client, worker, texts, cfg)

    probe.start()
    results, seconds, enqueue_seconds = asyncio.run(go())
    cpu = probe.stop()
    worker.sent += len(texts)
    after = _read_window(url, worker, expected=worker.sent)

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
        total_ms=_percentiles(total),
        queue_wait_ms=_percentiles(wait),
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
    say(f"  {worker.variant:<5} {trial.throughput:7.1f} req/s  in {seconds:.2f} s "
        f"(enqueue {enqueue_seconds:.2f} s); batch mean {trial.mean_batch_size_per_batch:.1f}, "
        f"{trial.batches} batches; model busy {trial.busy_fraction:.0%}, "
        f"forward-only {trial.forward_throughput:.1f} req/s; "
        f"p50 total {trial.total_ms['p50']:.0f} ms; other load {_load(trial.other_load)}")
    return trial


# ------------------------------------------------------------------------------ running


def _server_class() -> type[EmbeddedServer]:
    from inferq.embedded import EmbeddedServer

    class Server(EmbeddedServer):
        """The embedded server with its default settings (AOF on), stopped by SIGTERM if
        the benchmark is killed before it can stop it."""

        def command(self) -> list[str]:
            return dying_with_parent(super().command())

    return Server


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    return run_reported("embed", lambda cleanup: _run(cfg, cleanup), report_text)


def _run(cfg: EmbedConfig, cleanup: Cleanup) -> dict[str, Any]:
    import torch

    from inferq.worker.models.registry import minilm_path

    started = time.monotonic()
    texts = corpus.sentences(cfg.requests, seed=CORPUS_SEED, min_words=MIN_WORDS,
                             max_words=MAX_WORDS)
    warm_texts = corpus.sentences(cfg.warmup, seed=WARMUP_SEED, min_words=MIN_WORDS,
                                  max_words=MAX_WORDS)
    log_dir = cfg.out / "logs"
    data_dir = Path(tempfile.mkdtemp(prefix="inferq-bench-embed-"))
    cleanup.on_close("server data", lambda: shutil.rmtree(data_dir, ignore_errors=True))
    server = _server_class()(data_dir)
    machine = machine_info(server_binary=server.binary)
    say(f"embed benchmark: {cfg.requests} requests x {cfg.trials} trial(s); "
        f"{describe_machine(machine)}; load {machine['load_avg_1_5_15']}")

    say(f"starting {Path(server.binary).name} (AOF on) in {data_dir}")
    cleanup.on_close("server", server.stop)
    url = server.start()
    server_pid = server.process.pid if server.process else None
    # Workers load torch and the model while this process loads its own copy.
    workers = {v: start_worker(cleanup, url, v, log_dir) for v in ("full", "bs1")}

    say("loading the bare model in this process")
    bare = BareModel(minilm_path())
    tokens = bare.token_counts(texts)
    real_tokens = sum(tokens)
    say(f"corpus: {len(texts)} sentences, {statistics.fmean(tokens):.1f} tokens on average "
        f"({min(tokens)}..{max(tokens)}); torch threads {torch.get_num_threads()}")
    for bs in cfg.batch_sizes:
        bare.encode(warm_texts, bs)

    say("waiting for the workers, then warming them up")
    asyncio.run(warm_up(url, list(workers.values()), warm_texts, cfg))

    limit_trials: list[LimitTrial] = []
    stack_trials: dict[str, list[StackTrial]] = {"full": [], "bs1": []}
    reference: torch.Tensor | None = None
    for trial in range(cfg.trials):
        order = VARIANT_ORDERS[trial % len(VARIANT_ORDERS)]
        say(f"trial {trial + 1}/{cfg.trials}: {' -> '.join(order)}")
        for variant in order:
            if variant == "limit":
                probe = CpuProbe({"bench": None, "server": server_pid,
                                  **{f"{v}_worker": w.child.process.pid
                                     for v, w in workers.items()}})
                result, vectors = run_limit(bare, texts, cfg.batch_sizes, real_tokens, probe)
                limit_trials.append(result)
                reference = vectors if reference is None else reference
                continue
            if reference is None:
                reference = bare.encode(texts, 1)[0]
            other = workers["bs1" if variant == "full" else "full"]
            probe = CpuProbe({"worker": workers[variant].child.process.pid,
                              "server": server_pid, "producer": None,
                              "idle_worker": other.child.process.pid})
            stack_trials[variant].append(
                run_stack_trial(url, workers[variant], texts, tokens, reference, cfg, probe))

    say("stopping the workers and the server")
    final_windows: dict[str, Any] = {}
    exit_codes: dict[str, int | None] = {}
    for variant, worker in workers.items():
        exit_codes[variant] = stop_child(worker.child)
        final_windows[variant] = _read_window(url, worker, expected=worker.sent, timeout_s=0)
    server.stop()

    report = build_report(cfg, machine, texts, tokens, limit_trials, stack_trials,
                          final_windows, exit_codes, time.monotonic() - started)
    json_path = cfg.out / "embed.json"
    write_json(json_path, report)
    say(f"wrote {json_path}")
    if cfg.results_md is not None:
        update_results_md(NAME, results_markdown(report), cfg.results_md)
        say(f"updated {cfg.results_md}")
    return report


# ------------------------------------------------------------------------------ reports


def _verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("PASS" if value >= target else "MISS")


def build_report(cfg: EmbedConfig, machine: dict[str, Any], texts: Sequence[str],
                 tokens: Sequence[int], limit_trials: Sequence[LimitTrial],
                 stack_trials: Mapping[str, Sequence[StackTrial]],
                 final_windows: Mapping[str, Any], exit_codes: Mapping[str, int | None],
                 elapsed_s: float) -> dict[str, Any]:
    per_bs = {bs: summary([t.per_batch_size[bs] for t in limit_trials])
              for bs in cfg.batch_sizes}
    best_bs = max(cfg.batch_sizes, key=lambda bs: per_bs[bs]["median"] or 0.0)
    limit = [t.per_batch_size[best_bs] for t in limit_trials]
    full = [t.throughput for t in stack_trials["full"]]
    bs1 = [t.throughput for t in stack_trials["bs1"]]
    # Paired per trial: the variants of one trial ran back to back on the same machine state.
    full_over_limit = summary([f / lim for f, lim in zip(full, limit, strict=True)])
    full_over_bs1 = summary([f / b for f, b in zip(full, bs1, strict=True)])
    loads = [x for t in limit_trials for x in t.other_load.values() if x is not None]
    loads += [t.other_load for ts in stack_trials.values() for t in ts
              if t.other_load is not None]

    def stack(variant: str) -> dict[str, Any]:
        trials = stack_trials[variant]
        return {
            "throughput": summary([t.throughput for t in trials]),
            "forward_throughput": summary([t.forward_throughput for t in trials]),
            "busy_fraction": summary([t.busy_fraction for t in trials]),
            "mean_batch_size_per_request": summary(
                [t.mean_batch_size_per_request for t in trials]),
            "mean_batch_size_per_batch": summary([t.mean_batch_size_per_batch for t in trials]),
            "padding_efficiency": summary([t.padding_efficiency for t in trials]),
            "other_load": summary([t.other_load for t in trials if t.other_load is not None]),
            "requests_per_cpu_second": summary([t.requests_per_cpu_second for t in trials
                                                if t.requests_per_cpu_second is not None]),
            "cpu_seconds_per_1000": {
                name: summary([1000 * c / len(texts) for t in trials
                               if (c := t.cpu_seconds.get(name)) is not None])
                for name in ("worker", "server", "producer", "idle_worker")},
            "total_ms": {q: summary([t.total_ms[q] or 0.0 for t in trials])
                         for q in ("p50", "p90", "p99")},
            "queue_wait_ms": {q: summary([t.queue_wait_ms[q] or 0.0 for t in trials])
                              for q in ("p50", "p90", "p99")},
            "trials": [asdict(t) for t in trials],
            "worker_window_final": final_windows.get(variant, {}),
            "worker_exit_code": exit_codes.get(variant),
        }

    return {
        "scenario": NAME,
        "command": command_line(),
        "date": now_utc(),
        "quick": cfg.quick,
        "elapsed_s": round(elapsed_s, 1),
        "config": {**asdict(cfg), "out": str(cfg.out),
                   "results_md": str(cfg.results_md) if cfg.results_md else None,
                   "result_timeout_s": cfg.result_timeout_s},
        "machine": machine,
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
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
        "noise": {"max_other_load": max(loads, default=None),
                  "disturbed": max(loads, default=0.0) > DISTURBED_LOAD},
        "ratios": {
            "full_over_limit": {**full_over_limit, "target": TARGET_FULL_OVER_LIMIT,
                                "verdict": _verdict(full_over_limit["median"],
                                                    TARGET_FULL_OVER_LIMIT)},
            "full_over_bs1": {**full_over_bs1, "target": TARGET_FULL_OVER_BS1,
                              "verdict": _verdict(full_over_bs1["median"],
                                                  TARGET_FULL_OVER_BS1)},
        },
    }


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return str(path)


def _ms(s: Mapping[str, Any]) -> str:
    return fmt_range(s, 0)


def _pct(s: Mapping[str, Any]) -> str:
    return fmt_range(summary([x * 100 for x in s["trials"]]), 0, "%")


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
    noise = r["noise"]
    warning = ("" if not noise["disturbed"] else
               f"\n> **Disturbed run**: other processes used up to "
               f"{noise['max_other_load']:.0%} of the machine during a measurement "
               f"(see \"other tenants' load\" below); wall-clock figures are unreliable.\n")
    corpus_info = r["corpus"]
    m = r["machine"]
    quick = ("\n> **Quick run** (`--quick`): a smoke test with few requests and one trial, not "
             "a measurement.\n" if r["quick"] else "")
    return f"""## embed: MiniLM sentence embeddings, full stack vs the bare model
{quick}{warning}
- Command: `{r['command']}` ({r['elapsed_s']:.0f} s)
- Date: {r['date']}; git {str(m['git']['commit'])[:10]}{' (dirty tree)' if m['git']['dirty'] else ''}
- Machine: {describe_machine(m)}; load average {m['load_avg_1_5_15']} at start, {r['load_avg_end']} at end
- Workload: {n} distinct sentences per pass ({corpus_info['tokens_mean']:.1f} tokens on average, {corpus_info['tokens_min']}..{corpus_info['tokens_max']}), the same for every variant; {len(full['throughput']['trials'])} trial(s), variants rotated per trial; median (min..max) over trials.
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

Raw figures: `{_display_path(Path(r['config']['out']) / 'embed.json')}`.
"""  # noqa: E501


def report_text(r: Mapping[str, Any]) -> str:
    lim, ratios = r["limit"], r["ratios"]
    lines = ["embed: requests/s, median (min..max) over trials"]
    for bs, s in lim["per_batch_size"].items():
        lines.append(f"  bare model batch {bs:>3}: {fmt_range(s)}")
    lines.append(f"  bare model batch {lim['sorted_batch_size']} sorted: "
                 f"{fmt_range(lim['sorted_throughput'])}")
    lines.append(f"  limit (batch {lim['best_batch_size']}): {fmt_range(lim['throughput'])}")
    for variant in ("full", "bs1"):
        v = r[variant]
        lines.append(f"  {variant:<4}: {fmt_range(v['throughput'])}  forward-only "
                     f"{fmt_range(v['forward_throughput'])}, mean batch "
                     f"{fmt_range(v['mean_batch_size_per_batch'])}, total ms p50/p99 "
                     f"{_ms(v['total_ms']['p50'])}/{_ms(v['total_ms']['p99'])}")
    best = str(lim["best_batch_size"])
    lines.append(f"  requests per CPU-second: bare batch {best} "
                 f"{fmt_range(lim['per_cpu_second'][best])}, full "
                 f"{fmt_range(r['full']['requests_per_cpu_second'])}, bs1 "
                 f"{fmt_range(r['bs1']['requests_per_cpu_second'])}")
    for key, label in (("full_over_limit", "full / limit"), ("full_over_bs1", "full / bs1")):
        ratio = ratios[key]
        lines.append(f"  {label}: {fmt_range(ratio, 2)} (target >= {ratio['target']}) "
                     f"{ratio['verdict']}")
    if r["noise"]["disturbed"]:
        lines.append(f"  WARNING: other processes used up to {r['noise']['max_other_load']:.0%}"
                     " of the machine during measurements; wall-clock figures are unreliable")
    return "\n".join(lines)
