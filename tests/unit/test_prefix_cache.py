"""The engine's prefix cache (``prefixcache``): outputs are token for token those without it,
only the uncached rest of a prompt is computed, and the cache stays within its bounds."""

from __future__ import annotations

import random

import pytest
import torch

from inferq.protocol.generation import GenerationParams
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.prefixcache import BLOCK, PrefixCache
from inferq.worker.generate.scheduler import Budget
from inferq.worker.models.lm import CausalLM
from tests.support.generation import WORDS, greedy_reference
from tests.unit.test_generate_engine import drive

BUDGET = Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=4096)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(lm: CausalLM, seed: int = 0) -> list[list[int]]:
    """Prompts over two shared 'system prompts' (about 100 tokens), some of them later turns
    that extend an earlier prompt, and a few with nothing shared."""
    rng = random.Random(seed)
    systems = [text(rng, 60), text(rng, 70)]
    out: list[str] = []
    for i in range(14):
        if i % 5 == 4:
            out.append(text(rng, rng.randint(3, 30)))
        elif i % 3 == 2 and out:
            out.append(out[-1] + " " + text(rng, rng.randint(2, 20)))  # a next turn
        else:
            out.append(systems[i % 2] + " " + text(rng, rng.randint(1, 25)))
    return [lm.tokenizer(t)["input_ids"] for t in out]


def run(lm: CausalLM, prompts: list[list[int]], params: list[GenerationParams],
        cache_bytes: int, arrivals: list[int]) -> tuple[Engine, list[Generation]]:
    engine = Engine(lm, BUDGET, prefix_cache_bytes=cache_bytes)
    gens = [engine.new_generation(f"r{i}", ids, p)
            for i, (ids, p) in enumerate(zip(prompts, params, strict=True))]
    drive(engine, list(zip(arrivals, gens, strict=True)))
    return engine, gens


@pytest.mark.parametrize("sampled", [False, True])
def test_outputs_are_identical_with_the_cache_on_and_off(lm: CausalLM, sampled: bool) -> None:
    prompts = workload(lm)
    rng = random.Random(3)
    params = [GenerationParams(max_new_tokens=rng.randint(1, 12), ignore_eos=sampled,
                               **({"temperature": 0.9, "top_p": 0.9, "seed": i}
                                  if sampled else {}))
              for i in range(len(prompts))]
    # staggered: hits and misses join the batch at different steps, and share prefills
    arrivals = [rng.randint(0, 20) for _ in prompts]
    on, with_cache = run(lm, prompts, params, 64 << 20, arrivals)
    _, without = run(lm, prompts, params, 0, arrivals)
    assert [g.tokens for g in with_cache] == [g.tokens for g in without]
    if not sampled:
        for g in with_cache:
            assert g.tokens == greedy_reference(lm, g.prompt_ids, g.params.max_new_tokens)
    assert on.prefix is not None
    reused = [g.cached_tokens for g in with_cache]
    assert sum(1 for r in reused if r) >= 6, reused   # the cache was really used
    assert all(r % BLOCK == 0 and r < len(g.prompt_ids)
               for r, g in zip(reused, with_cache, strict=True))
    stats = on.prefix.stats
    assert stats.reused_tokens == sum(reused) and 0 < stats.hit_rate < 1


def test_a_hit_computes_only_the_rest(lm: CausalLM) -> None:
    """A prompt whose prefix is cached runs the model over its uncached tokens only."""
    prompts = workload(lm)
    engine = Engine(lm, BUDGET, prefix_cache_bytes=64 << 20)
    widths: list[int] = []
    forward = engine._forward

    def counting(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
                 ) -> torch.Tensor:
        widths.append(int(ids.shape[1]))
        return forward(ids, mask, positions)

    engine._forward = counting  # type: ignore[method-assign]
    first = engine.new_generation("a", prompts[0], GenerationParams(max_new_tokens=1))
    engine.step([first])
    again = engine.new_generation("b", prompts[0] + prompts[3][:5],
                                  GenerationParams(max_new_tokens=1))
    engine.step([again])
    assert widths[0] == len(prompts[0])
    cached = len(prompts[0]) // BLOCK * BLOCK
    assert again.cached_tokens == cached
    assert widths[1] == len(again.prompt_ids) - cached


def test_the_cache_keeps_to_its_limit_and_to_the_room_running_sequences_leave(
        lm: CausalLM) -> None:
    prompts = workload(lm, seed=5)
    block = lm.kv.bytes_per_token * BLOCK
    engine = Engine(lm, BUDGET, prefix_cache_bytes=3 * block)
    drive(engine, [(i, engine.new_generation(f"r{i}", p, GenerationParams(max_new_tokens=2)))
                   for i, p in enumerate(prompts)])
    assert engine.prefix is not None
    assert engine.prefix.bytes <= 3 * block and len(engine.prefix) == 3
    assert engine.prefix.stats.evicted_blocks > 0
    # A budget the running sequences fill: nothing stays cached beside them.
    tight = Budget(max_slots=4, kv_tokens=engine.footprint(1, 512), max_prefill_tokens=4096)
    full = Engine(lm, tight, prefix_cache_bytes=64 << 20)
    g = full.new_generation("g", prompts[0], GenerationParams(
        max_new_tokens=512 - len(prompts[0]), ignore_eos=True))
    full.step([g])
    assert full.prefix is not None and full.prefix.bytes == 0


def test_eviction_takes_extensions_before_their_prefixes() -> None:
    room = 10**9
    cache = PrefixCache(3 * 4, lambda: room)  # three blocks of 4 bytes
    block = torch.zeros(4, dtype=torch.uint8)
    base = list(range(BLOCK * 2))
    cache.insert(base, len(base), lambda s, e: block.clone())          # P, A
    cache.insert(base[:BLOCK] + [7] * BLOCK, 2 * BLOCK, lambda s, e: block.clone())  # B
    assert len(cache) == 3
    cache.insert(base[:BLOCK] + [9] * BLOCK, 2 * BLOCK, lambda s, e: block.clone())  # C
    # A (the oldest extension) went; the shared first block P stayed
    assert cache.lookup([*base, 1])[0] == BLOCK
    assert cache.lookup(base[:BLOCK] + [9] * BLOCK + [1])[0] == 2 * BLOCK
