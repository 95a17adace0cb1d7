"""Scenario ``engines``: the in-process measurement behind the engine choice, on the tiny random
Llama and SmolLM2-135M: our KV-cache loop vs transformers' continuous batching vs padded
``generate``, and our loop next to a GIL-holding thread or a busy process (see
benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.framework import Run, Scenario, noise_of, render
from benchmarks.harness import (
    CpuProbe,
    fmt_number,
    markdown_table,
    median_of,
    names_of,
    say,
    usable_cpus,
)
from benchmarks.models import GENERATION_MODELS as MODELS
from benchmarks.models import (
    SLOTS,
    TORCH_THREADS,
    generation_source,
    load_lm,
    open_engine,
    serve_engine,
    torch_threads,
)

#: The comparison also runs our engine next to a thread that holds the GIL this long
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


#: Per model: requests, new tokens per request, seconds transformers' manager may take.
SIZES = {"tiny": (32, 100, 60.0), "smollm2": (16, 32, 120.0)}


@dataclass(frozen=True)
class EnginesConfig:
    models: tuple[str, ...]


def compare_engines(source: str, *, requests: int, new_tokens: int, slots: int,
                    trials: int, hf_timeout_s: float, threads: int | None) -> dict[str, Any]:
    """Tokens/s of the three ways to batch generation, in process, same prompts, interleaved
    trials: our engine, transformers' ContinuousBatchingManager, padded generate."""
    with torch_threads(threads):
        return _compare(source, requests=requests, new_tokens=new_tokens, slots=slots,
                        trials=trials, hf_timeout_s=hf_timeout_s)


def _compare(source: str, *, requests: int, new_tokens: int, slots: int, trials: int,
             hf_timeout_s: float) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from inferq.protocol.generation import GenerationParams

    lm = load_lm(source)
    prompts = [lm.tokenizer(f"Request number {i} asks the queue worker about its day",
                            add_special_tokens=False)["input_ids"] for i in range(requests)]

    def ours() -> float:
        engine = open_engine(lm, slots)
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

    def ours_next_to(kind: str) -> float:
        """``ours`` while another thread of the process (``thread``) runs Python 1 ms in every
        5 (what a worker's event loop does between Redis round trips: claims, stream writes),
        or a process does the same (``process``: the same CPU taken, but no GIL shared)."""
        spawn = multiprocessing.get_context("spawn")
        halt = threading.Event() if kind == "thread" else spawn.Event()
        busy = (threading.Thread if kind == "thread" else spawn.Process)(
            target=busy_python, args=(halt,), daemon=True)
        busy.start()
        try:
            return ours()
        finally:
            halt.set()
            busy.join(10)

    runs: dict[str, list[float | None]] = {"ours": [], "ours_sharing_the_gil": [],
                                           "ours_next_to_a_busy_process": [],
                                           "transformers_cb": [], "padded_generate": []}
    ours()  # warm-up
    probe = CpuProbe({"bench": None})
    before = os.times()
    probe.start()
    for _ in range(trials):
        runs["ours"].append(ours())
        runs["ours_sharing_the_gil"].append(ours_next_to("thread"))
        runs["ours_next_to_a_busy_process"].append(ours_next_to("process"))
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


# ------------------------------------------------------------------------------- reading


def queue_figures(path: Path) -> dict[str, Any] | None:
    """The tiny model's workers in the ``generate`` report at ``path`` (None when there is
    none): the continuous and request-level tokens/s, the cores the continuous worker used and
    its share of the engine alone."""
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    tiny = report.get("models", {}).get("tiny")
    if not tiny:
        return None
    runs = tiny["variants"].get("continuous", [])
    return {
        "generate_json": str(path), "date": report.get("date"), "command": report.get("command"),
        **{v: median_of([r["tokens_per_s"] for r in tiny["variants"].get(v, [])])
           for v in ("continuous", "request", "process")},
        "cores": median_of([r["cpu"]["worker"] / r["cpu"]["wall_s"] for r in runs
                            if r["cpu"].get("worker") is not None and r["cpu"].get("wall_s")]),
        "vs_engine_alone": tiny.get("ratios", {}).get("vs_engine_alone"),
        "process_vs_engine_alone": tiny.get("ratios", {}).get("process_vs_engine_alone")}


def _reading(report: Mapping[str, Any]) -> str:
    """What the tiny model's figures mean, next to the workers of the latest ``generate``."""
    queue, engines = report.get("queue"), report["engines"].get("tiny")
    if not queue or not engines:
        return ""
    t = engines["tokens_per_s"]
    alone, thread, process = (median_of(t.get(k, [])) for k in (
        "ours", "ours_sharing_the_gil", "ours_next_to_a_busy_process"))
    continuous, request, cores = queue["continuous"], queue["request"], queue["cores"]
    if alone is None or thread is None or process is None or None in (continuous, request):
        return ""
    small = report["engines"].get("smollm2", {}).get("tokens_per_s", {})
    s_alone, s_thread, s_process = (median_of(small.get(k, [])) for k in (
        "ours", "ours_sharing_the_gil", "ours_next_to_a_busy_process"))
    gil = (process - thread) / alone
    why, gain = render("engines.small-gil" if gil < 0.05 else "engines.large-gil", {}, gil=gil,
                       cpu=1 - process / alone).rstrip().split("|")
    share = queue.get("process_vs_engine_alone")
    ceiling = queue["vs_engine_alone"]
    return render(
        "engines.reading", queue, alone=alone, thread=thread, process=process, why=why,
        gain=gain, thread_share=thread / alone, process_share=process / alone,
        busy=f"{GIL_BUSY_MS / GIL_PERIOD_MS:.0%}",
        used="The continuous worker: " if cores is None
        else f"The continuous worker's process used {cores:.2f} cores: ",
        vs_alone="" if ceiling is None
        else f" ({ceiling:.2f}x of its engine alone on the same paced requests)",
        process_line="" if not queue.get("process") or not continuous else render(
            "engines.process", queue, share=queue["process"] / continuous,
            of_alone="" if share is None else f", {share:.2f}x of its engine alone").rstrip(),
        smollm2="" if not s_alone or s_thread is None or s_process is None else render(
            "engines.smollm2", {}, thread=s_thread / s_alone,
            process=s_process / s_alone).rstrip())


# ------------------------------------------------------------------------------ scenario


class Engines(Scenario[EnginesConfig]):
    name = "engines"
    title = "our KV-cache loop vs transformers' continuous batching"
    quick_help = "SmolLM2 one trial"
    config = EnginesConfig
    trials = (3, 3)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--models", type=names_of(MODELS), default=MODELS,
                            help=f"comma-separated, from {', '.join(MODELS)}")

    def measure(self, run: Run[EnginesConfig]) -> dict[str, Any]:
        engines = {}
        for model in run.cfg.models:
            say(f"{model}: comparing engines in process")
            requests, new_tokens, hf_timeout_s = SIZES[model]
            engines[model] = compare_engines(
                generation_source(model, run.out), requests=requests, new_tokens=new_tokens,
                slots=SLOTS, trials=1 if run.quick and model != "tiny" else run.trials,
                hf_timeout_s=hf_timeout_s, threads=TORCH_THREADS[model])
        return {"engines": engines, "queue": queue_figures(run.out / "generate.json"),
                "noise": noise_of(e["other_load"] for e in engines.values())}

    def markdown(self, report: Mapping[str, Any]) -> str:
        rows = []
        for model, e in report["engines"].items():
            t = e["tokens_per_s"]
            load = e.get("other_load")
            rows.append([f"{model} ({e['requests']} x {e['new_tokens']}, "
                         f"{e.get('torch_threads', '?')} torch threads)",
                         *(fmt_number(median_of(t.get(k, []))) for k in (
                             "ours", "ours_sharing_the_gil", "ours_next_to_a_busy_process",
                             "transformers_cb", "padded_generate")),
                         "n/a" if load is None else f"{load:.0%}"])
        return render("engines", report, slots=SLOTS, reading=_reading(report),
                      table=markdown_table([
                          "model", "ours tokens/s", f"ours, another thread holding the GIL "
                          f"{GIL_BUSY_MS:g} ms in {GIL_PERIOD_MS:g}",
                          "ours, another process busy as long (no GIL shared)",
                          "transformers CB tokens/s", "padded generate (static batches) tokens/s",
                          "other tenants' load"], rows))


SCENARIO = Engines()
