"""Scenario ``engine-vs-vllm``: inferq's transformers ``Engine`` alone (no queue, no process)
next to vLLM offline (``vllm.LLM``), on SmolLM2-135M fp32, the same random prompts, in one run:
output tokens/s at issue #34's shape (64 tokens in, 128 out, 16 concurrent sequences, EOS
ignored) and the time of one decode step at batch 16. Run it with the Python of a venv that has
vLLM (``PYTHONPATH`` on this checkout).

A decode step is measured the same way on both: (the time of 16 prompts generating 1 + N tokens
- the time of the same 16 generating 1) / N, so it includes what each engine does per step
around its forward (sampling, scheduling), not only the forward. For inferq's engine the median
wall time of its ``step`` calls at batch 16 is reported as well.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.framework import ByMode, Run, Scenario, flag, switch
from benchmarks.harness import BenchmarkFailed, fmt_number, positive_int, say
from benchmarks.models import load_lm, open_engine, serve_engine

INPUT_TOKENS, OUTPUT_TOKENS, SEQUENCES = 64, 128, 16
#: vLLM's KV cache in GiB, as in ``llm-serve`` (its default would size itself from RAM).
KVCACHE_GIB = "2"


@dataclass(frozen=True)
class EngineVsVllmConfig:
    prompts: int = flag(positive_int, ByMode(32, 16), "prompts per throughput run")
    enforce_eager: bool = switch("start vLLM with enforce_eager (no torch.compile; the "
                                 "default is vLLM's, as `vllm serve` runs)")
    seed: int = flag(int, 7)


def _prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(INPUT_TOKENS)] for _ in range(count)]


def _inferq(source: str, prompts: Sequence[list[int]]) -> dict[str, Any]:
    import torch

    from inferq.protocol.generation import GenerationParams

    lm = load_lm(source)

    def run(batch: Sequence[list[int]], new_tokens: int) -> float:
        engine = open_engine(lm, SEQUENCES)
        params = GenerationParams(max_new_tokens=new_tokens, ignore_eos=True)
        gens = [engine.new_generation(f"r{i}", list(p), params) for i, p in enumerate(batch)]
        start, _ = serve_engine(engine, gens)
        return time.monotonic() - start

    def step_times(batch: Sequence[list[int]], steps: int) -> list[float]:
        engine = open_engine(lm, SEQUENCES)
        params = GenerationParams(max_new_tokens=steps + 1, ignore_eos=True)
        gens = [engine.new_generation(f"s{i}", list(p), params) for i, p in enumerate(batch)]
        engine.step(engine.select(gens))
        times = []
        while len(engine.running) == len(batch):
            t = time.perf_counter()
            engine.step(())
            times.append(time.perf_counter() - t)
        return times

    run(prompts[:SEQUENCES], 4)  # warm-up
    one = prompts[:SEQUENCES]
    say("  inferq engine: throughput run")
    wall = run(prompts, OUTPUT_TOKENS)
    say("  inferq engine: decode step at batch 16")
    prefill = run(one, 1)
    full = run(one, 1 + OUTPUT_TOKENS)
    direct = step_times(one, 32)
    return {"wall_s": round(wall, 3), "tokens_per_s": len(prompts) * OUTPUT_TOKENS / wall,
            "decode_step_ms": (full - prefill) / OUTPUT_TOKENS * 1e3,
            "step_call_ms_median": statistics.median(direct) * 1e3,
            "prefill_16_s": round(prefill, 3), "torch_threads": torch.get_num_threads()}


def _vllm(source: str, prompts: Sequence[list[int]], enforce_eager: bool) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KVCACHE_GIB)
    try:
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        raise BenchmarkFailed("vLLM is not importable: run this scenario with the Python of a "
                              "venv that has vLLM, PYTHONPATH on this checkout") from exc
    say("  vLLM offline: starting LLM(...)")
    t = time.monotonic()
    llm = LLM(model=source, dtype="float32", max_num_seqs=SEQUENCES, seed=0,
              enforce_eager=enforce_eager)
    started_s = time.monotonic() - t

    def run(batch: Sequence[list[int]], new_tokens: int) -> tuple[float, int]:
        params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True,
                                temperature=0.0)
        t0 = time.monotonic()
        outs = llm.generate([{"prompt_token_ids": list(p)} for p in batch], params,
                            use_tqdm=False)
        return time.monotonic() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    run(prompts[:SEQUENCES], 4)  # warm-up
    one = prompts[:SEQUENCES]
    say("  vLLM offline: throughput run")
    wall, tokens = run(prompts, OUTPUT_TOKENS)
    if tokens != len(prompts) * OUTPUT_TOKENS:
        raise BenchmarkFailed(f"vLLM generated {tokens} tokens, not "
                              f"{len(prompts) * OUTPUT_TOKENS}")
    say("  vLLM offline: decode step at batch 16")
    prefill, _ = run(one, 1)
    full, _ = run(one, 1 + OUTPUT_TOKENS)
    import vllm

    return {"wall_s": round(wall, 3), "tokens_per_s": tokens / wall,
            "decode_step_ms": (full - prefill) / OUTPUT_TOKENS * 1e3,
            "prefill_16_s": round(prefill, 3), "start_s": round(started_s, 1),
            "version": vllm.__version__, "enforce_eager": enforce_eager}


class EngineVsVllm(Scenario[EngineVsVllmConfig]):
    name = "engine-vs-vllm"
    title = "inferq's transformers engine alone vs vLLM offline, SmolLM2 at 16 sequences"
    quick_help = "16 prompts"
    config = EngineVsVllmConfig
    trials = None

    def measure(self, run: Run[EngineVsVllmConfig]) -> dict[str, Any]:
        from inferq.worker.models.convert import ensure_smollm2

        source = str(ensure_smollm2())
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(source))
        prompts = _prompts(vocab, run.cfg.prompts, run.cfg.seed)
        say("inferq's Engine alone (transformers forward)")
        ours = _inferq(source, prompts)
        say("vLLM offline (vllm.LLM)")
        theirs = _vllm(source, prompts, run.cfg.enforce_eager)
        return {"shape": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                          "sequences": SEQUENCES, "prompts": len(prompts)},
                "inferq": ours, "vllm": theirs,
                "ratios": {"tokens_per_s": ours["tokens_per_s"] / theirs["tokens_per_s"],
                           "decode_step_ms": ours["decode_step_ms"] / theirs["decode_step_ms"]}}

    def markdown(self, report: Mapping[str, Any]) -> str:
        s, ours, theirs, r = (report[k] for k in ("shape", "inferq", "vllm", "ratios"))
        eager = "enforce_eager" if theirs["enforce_eager"] else "compiled (vLLM's default)"
        rows = [
            "| engine | output tokens/s | decode step at batch 16, ms | 16 prompts' prefill "
            "+ 1 token, s |",
            "|---|---|---|---|",
            f"| inferq `Engine` alone (transformers forward, 16 slots) | "
            f"{fmt_number(ours['tokens_per_s'])} | {ours['decode_step_ms']:.1f} (its `step` "
            f"call alone: {ours['step_call_ms_median']:.1f}) | {ours['prefill_16_s']:.2f} |",
            f"| vLLM {theirs['version']} offline `LLM(...)`, {eager}, max_num_seqs 16 | "
            f"{fmt_number(theirs['tokens_per_s'])} | {theirs['decode_step_ms']:.1f} | "
            f"{theirs['prefill_16_s']:.2f} |",
            "", f"- inferq / vLLM output tokens/s: **{r['tokens_per_s']:.2f}x**; decode step "
            f"time inferq / vLLM: **{r['decode_step_ms']:.2f}x**.",
            f"- Shape: {s['prompts']} prompts of {s['input_tokens']} random token ids, "
            f"{s['output_tokens']} output tokens each, EOS ignored, {s['sequences']} sequences "
            "at once, greedy; SmolLM2-135M fp32 on the CPU; vLLM's KV cache "
            f"{KVCACHE_GIB} GiB. Decode step: (16 prompts generating {1 + s['output_tokens']} "
            "tokens - the same 16 generating 1) / "
            f"{s['output_tokens']}, on both engines.",
            "- vLLM's engine core runs in a process of its own, inferq's engine in the "
            f"benchmark's ({ours['torch_threads']} torch threads); one after the other on the "
            "same CPUs.",
        ]
        return "\n".join(rows) + "\n"


SCENARIO = EngineVsVllm()
