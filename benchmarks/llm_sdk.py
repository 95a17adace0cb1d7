"""The ``llm-serve`` load through inferq's SDK instead of HTTP: the same shape as
``vllm bench serve --dataset-name random --max-concurrency C --ignore-eos`` (random prompts of
``input_len`` tokens as one chat message, ``output_len`` tokens each, ``concurrency`` in
flight), with ``AsyncClient.enqueue`` and ``AsyncHandle.stream`` on the same queue the gateway
feeds; its figures carry the names vLLM's client saves, so both go in one table.

TTFT is from the enqueue call to the first text delta, ITL the gaps between deltas (the
worker may merge the tokens of one stream interval into one delta: then ITL is per delta, as
vLLM's client counts it per chunk).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import percentile


def random_prompts(tokenizer_path: str, count: int, input_len: int, seed: int = 0
                   ) -> list[str]:
    """``count`` prompts of ``input_len`` random tokens of the model's vocabulary, decoded (as
    vLLM's random dataset makes them)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    special = set(tok.all_special_ids)
    vocab = [i for i in range(tok.vocab_size) if i not in special]
    rng = random.Random(seed)
    return [str(tok.decode([rng.choice(vocab) for _ in range(input_len)]))
            for _ in range(count)]


async def _one(client: Any, model: str, prompt: str, output_len: int) -> dict[str, Any]:
    sent = time.perf_counter()
    handle = await client.enqueue("", model=model, task="generate",
                                  messages=[{"role": "user", "content": prompt}],
                                  params={"max_new_tokens": output_len, "ignore_eos": True})
    marks: list[float] = []
    result = None
    async for item in handle.stream(timeout=600):
        if isinstance(item, str):
            if item:
                marks.append(time.perf_counter())
        else:
            result = item
    done = time.perf_counter()
    ok = result is not None and result.ok and bool(marks)
    tokens = (result.usage.completion_tokens if ok and result is not None
              and result.usage is not None else 0)
    return {"ok": ok, "ttft": marks[0] - sent if marks else None,
            "itl": [b - a for a, b in itertools.pairwise(marks)],
            "e2el": done - sent, "tokens": tokens}


async def _load(url: str, model: str, prompts: Sequence[str], output_len: int,
                concurrency: int) -> tuple[list[dict[str, Any]], float]:
    import inferq

    async with inferq.AsyncClient(url) as client:
        todo = iter(prompts)
        out: list[dict[str, Any]] = []

        async def lane() -> None:
            for prompt in todo:
                out.append(await _one(client, model, prompt, output_len))

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return out, time.perf_counter() - started


def sdk_bench(url: str, model: str, prompts: Sequence[str], *, output_len: int,
              concurrency: int) -> dict[str, Any]:
    """One run of the load; figures named as ``vllm bench serve`` saves them."""
    runs, duration = asyncio.run(_load(url, model, prompts, output_len, concurrency))
    good = [r for r in runs if r["ok"]]
    ttft = [r["ttft"] * 1e3 for r in good]
    itl = [x * 1e3 for r in good for x in r["itl"]]
    tpot = [(r["e2el"] - r["ttft"]) * 1e3 / (r["tokens"] - 1) for r in good if r["tokens"] > 1]
    e2el = [r["e2el"] * 1e3 for r in good]
    tokens = sum(r["tokens"] for r in good)
    figures: dict[str, Any] = {
        "completed": len(good), "failed": len(runs) - len(good), "duration": duration,
        "request_throughput": len(good) / duration, "output_throughput": tokens / duration}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        for q in (50, 99):
            figures[f"p{q}_{name}_ms"] = percentile(values, q)
    return figures
