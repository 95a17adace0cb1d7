"""The iteration-level engine on its own (no Redis): requests join and leave at every step and
greedy output still equals transformers' ``generate`` on each request alone, token for token."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.scheduler import Budget
from inferq.worker.models.lm import CausalLM
from tests.support.generation import WORDS, greedy_reference
from tests.support.tiny import build_tiny_model


def prompts(lm: CausalLM, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
        out.append(lm.tokenizer(text)["input_ids"])
    return out


def drive(engine: Engine, arrivals: list[tuple[int, Generation]]) -> int:
    """Run until all are done; ``arrivals`` are (step, generation): each becomes waiting at
    that step. Returns the number of steps."""
    waiting: list[Generation] = []
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or waiting or engine.running:
        while pending and pending[0][0] <= step:
            waiting.append(pending.pop(0)[1])
        admitted = engine.select(waiting)
        for g in admitted:
            waiting.remove(g)
        engine.step(admitted)
        step += 1
    return step


def test_staggered_mixed_batch_equals_generate_alone(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=6, kv_tokens=1 << 20, max_prefill_tokens=64))
    rng = random.Random(1)
    gens = [engine.new_generation(f"r{i}", ids,
                                  GenerationParams(max_new_tokens=rng.randint(1, 40)))
            for i, ids in enumerate(prompts(lm, 20))]
    # Arrivals spread over time, 6 slots: sequences join and leave at many different steps.
    drive(engine, [(rng.randint(0, 30), g) for g in gens])
    for g in gens:
        assert g.tokens == greedy_reference(lm, g.prompt_ids, g.params.max_new_tokens), g.id
        assert g.detok.text == lm.decode([t for t in g.tokens if t not in lm.eos_ids])
        assert g.finish in (FinishReason.STOP, FinishReason.LENGTH)
    assert engine.running == [] and engine.cache.rows == 0  # everything freed


def test_gpt2_architecture_works_too(tmp_path: Path) -> None:
    gpt2 = CausalLM(str(build_tiny_model(tmp_path, arch="gpt2")), device=torch.device("cpu"),
                    dtype=torch.float32)
    engine = Engine(gpt2, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = [engine.new_generation(f"g{i}", ids, GenerationParams(max_new_tokens=12 + i))
            for i, ids in enumerate(prompts(gpt2, 8, seed=3))]
    drive(engine, [(i, g) for i, g in enumerate(gens)])
    for g in gens:
        assert g.tokens == greedy_reference(gpt2, g.prompt_ids, g.params.max_new_tokens)


def test_seeded_sampling_does_not_depend_on_the_batch(lm: CausalLM) -> None:
    params = GenerationParams(max_new_tokens=20, temperature=0.9, top_p=0.95, seed=11,
                              ignore_eos=True)
    ids = prompts(lm, 1, seed=5)[0]

    def sample(with_others: bool) -> list[int]:
        engine = Engine(lm, Budget(max_slots=8, kv_tokens=1 << 20, max_prefill_tokens=4096))
        target = engine.new_generation("t", ids, params)
        others = [engine.new_generation(f"o{i}", p, GenerationParams(
            max_new_tokens=5 + i, temperature=1.0)) for i, p in enumerate(prompts(lm, 5))]
        drive(engine, [(0, target), *((i, o) for i, o in enumerate(others) if with_others)])
        return target.tokens

    assert sample(False) == sample(True)
    assert len(sample(False)) == 20


def test_cancel_frees_the_slot_and_others_continue_exactly(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=3, kv_tokens=1 << 20, max_prefill_tokens=4096))
    ps = prompts(lm, 4, seed=9)
    keep = [engine.new_generation(f"k{i}", p, GenerationParams(max_new_tokens=30,
                                                               ignore_eos=True))
            for i, p in enumerate(ps[:2])]
    victim = engine.new_generation("v", ps[2], GenerationParams(max_new_tokens=500,
                                                                ignore_eos=True))
    engine.step([*keep[:1], victim])  # victim in row 1; k0 row 0
    engine.step([keep[1]])
    for _ in range(3):
        engine.step()
    engine.cancel(victim)
    assert victim.finish is FinishReason.CANCELLED and not victim.in_batch
    late = engine.new_generation("late", ps[3], GenerationParams(max_new_tokens=10))
    assert engine.select([late]) == [late]  # the freed slot is admissible at once
    drive(engine, [(0, late)])
    for g in (*keep, late):
        expected = greedy_reference(lm, g.prompt_ids, g.params.max_new_tokens,
                                    ignore_eos=g.params.ignore_eos)
        assert g.tokens == expected


def test_context_length_caps_max_new_tokens(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=2, kv_tokens=1 << 22, max_prefill_tokens=4096))
    ids = [5] * (lm.max_positions - 3)
    g = engine.new_generation("long", ids, GenerationParams(max_new_tokens=50, ignore_eos=True))
    assert g.max_new == 3
    drive(engine, [(0, g)])
    assert len(g.tokens) == 3 and g.finish is FinishReason.LENGTH


@pytest.mark.parametrize("stop_at", [5, 12])
def test_stop_strings_end_the_generation(lm: CausalLM, stop_at: int) -> None:
    ids = prompts(lm, 1, seed=2)[0]
    reference = greedy_reference(lm, ids, 40, ignore_eos=True)
    full = lm.decode(reference)
    stop = full[stop_at:stop_at + 3]
    assert stop and stop in full
    engine = Engine(lm, Budget(max_slots=2, kv_tokens=1 << 20, max_prefill_tokens=4096))
    g = engine.new_generation("s", ids, GenerationParams(max_new_tokens=40, stop=[stop],
                                                         ignore_eos=True))
    drive(engine, [(0, g)])
    assert g.finish is FinishReason.STOP
    assert g.detok.text == full[:full.index(stop)]


def test_a_resumed_generation_goes_on_from_its_streamed_tokens(lm: CausalLM) -> None:
    ids = prompts(lm, 1, seed=4)[0]
    reference = greedy_reference(lm, ids, 30, ignore_eos=True)
    full = lm.decode(reference)
    engine = Engine(lm, Budget(max_slots=2, kv_tokens=1 << 20, max_prefill_tokens=4096))
    params = GenerationParams(max_new_tokens=30, ignore_eos=True)
    shown = lm.decode(reference[:12])
    g = engine.new_generation("r", ids, params, streamed=reference[:12], shown=shown)
    assert g.tokens == reference[:12] and g.prefill_tokens == len(ids) + 12
    assert g.finish is None and g.detok.emitted == len(shown)
    drive(engine, [(0, g)])
    assert g.tokens == reference  # 18 more: max_new_tokens counts the streamed ones
    assert g.detok.text == full
    # What the new steps hand out is what comes after the text already shown.
    assert shown + g.detok.delta(final=True) == full
    # A stream that already holds every token: finished on arrival, nothing to run.
    done = engine.new_generation("d", ids, params, streamed=reference, shown=full)
    assert done.finish is FinishReason.LENGTH and done.detok.text == full
