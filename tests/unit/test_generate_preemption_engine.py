"""Preemption in the step loop on the tiny Llama: the preempted sequence resumes, with its KV
cache swapped back in or recomputed, and produces exactly the tokens it would have without the
preemption, greedy or sampled with a seed; the urgent one is admitted at the next step
boundary."""

from __future__ import annotations

import pytest

from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.steploop import StepLoop, StepOutput
from inferq.worker.models.lm import CausalLM
from tests.support.step_events import RecordingEvents

BUDGET = Budget(max_slots=2, kv_tokens=1 << 20, max_prefill_tokens=4096)
SAMPLED = {"temperature": 1.0, "top_p": 0.9, "seed": 1234}


def low_generations(engine: Engine, lm: CausalLM, params: dict[str, object],
                    priorities: tuple[int, int] = (-10, -10)) -> list[Generation]:
    return [engine.new_generation(f"low{i}", lm.tokenizer(f"the queue worker {i}")["input_ids"],
                                  GenerationParams(max_new_tokens=32, ignore_eos=True,
                                                   **params),  # type: ignore[arg-type]
                                  priority=priorities[i], order=i) for i in range(2)]


def drive(loop: StepLoop, events: RecordingEvents, until_done: list[Generation],
          on_output: object = None) -> list[StepOutput]:
    outs: list[StepOutput] = []
    while not all(g.finish is not None for g in until_done):
        got = loop.take_outputs(arm=True)
        if not got:
            assert events.changed.wait(60), "the step loop stopped making progress"
            events.changed.clear()
        for out in got:
            outs.append(out)
            if callable(on_output):
                on_output(out)
    return outs


@pytest.mark.parametrize("victim", [1, 0], ids=["last-row", "first-row"])
@pytest.mark.parametrize("swap_bytes", [None, 0], ids=["swapped", "recomputed"])
@pytest.mark.parametrize("params", [{}, SAMPLED], ids=["greedy", "seeded"])
def test_a_preempted_sequence_resumes_with_exactly_the_same_tokens(
        lm: CausalLM, params: dict[str, object], swap_bytes: int | None, victim: int) -> None:
    # Both low-priority sequences are admitted in one step, low0 in row 0: the victim is the
    # latest admitted (low1, the last row) at equal priorities, or low0 when it is lower (its
    # row is then refilled by moving the last one).
    priorities = (-10, -10) if victim == 1 else (-10, -5)
    # Without preemption: the reference tokens.
    alone = Engine(lm, BUDGET)
    reference = low_generations(alone, lm, params, priorities)
    events = RecordingEvents()
    loop = StepLoop(alone, events)
    loop.start()
    loop.submit(reference)
    drive(loop, events, reference)
    loop.stop()
    loop.join(10)

    engine = Engine(lm, BUDGET)
    lows = low_generations(engine, lm, params, priorities)
    urgent = engine.new_generation("urgent", lm.tokenizer("urgent")["input_ids"],
                                   GenerationParams(max_new_tokens=10, ignore_eos=True),
                                   priority=50, order=9)
    events = RecordingEvents()
    loop = StepLoop(engine, events, swap_bytes=swap_bytes)
    submitted: list[int] = []

    def submit_urgent(out: StepOutput) -> None:
        if not submitted and all(len(g.tokens) >= 8 for g in lows):
            submitted.append(out.step)
            loop.submit([urgent])

    loop.start()
    loop.submit(lows)
    outs = drive(loop, events, [*lows, urgent], submit_urgent)
    loop.stop()
    loop.join(10)
    preempting = next(out for out in outs if out.preempted)
    # The latest admitted of the two (same step: the later order) left, the urgent one joined
    # in the same step boundary, and finished before either low-priority sequence.
    assert [g.id for g in preempting.preempted] == [f"low{victim}"]
    assert [g.id for g in preempting.entered] == ["urgent"]
    assert preempting.step - submitted[0] <= 2
    assert urgent.finish is FinishReason.LENGTH and urgent.finished_at is not None
    assert all(urgent.finished_at < (g.finished_at or 0) for g in lows)
    preempted, kept = lows[victim], lows[1 - victim]
    resumed = next(out for out in outs if preempted in out.entered
                   and out.step > preempting.step)
    if swap_bytes is None:  # its cache was put back: nothing prefilled again
        assert resumed.prefill_tokens == 0
    else:
        assert resumed.prefill_tokens >= len(preempted.prompt_ids) + 8
    assert preempted.swapped is None
    assert preempted.preemptions == 1 and kept.preemptions == 0
    for g, ref in zip(lows, reference, strict=True):
        assert g.finish is FinishReason.LENGTH
        assert g.tokens == ref.tokens
        assert g.detok.text == ref.detok.text


def test_a_failure_of_the_step_loop_itself_is_reported_not_swallowed(
        lm: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(lm, BUDGET)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the scheduler")

    monkeypatch.setattr(engine, "plan", broken)
    events = RecordingEvents()
    loop = StepLoop(engine, events)
    loop.start()
    loop.submit(low_generations(engine, lm, {}))
    assert events.changed.wait(60)
    loop.join(10)
    assert [str(e) for e in events.loop_errors] == ["a bug in the scheduler"]
