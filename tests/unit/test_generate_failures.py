"""Failed decode steps lose nothing but what they must: the model thread (``StepLoop``) on the
tiny Llama, with failures injected into the engine's prefill and decode.

Sequences pushed out of the batch keep their tokens and come back by recomputation, so every
survivor's output must still equal ``generate`` on the request alone, token for token."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

import torch

from inferq.errors import DeviceOutOfMemory
from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.core.failures import failure_of, is_out_of_memory
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.steploop import MAX_STEP_FAILURES, StepLoop
from inferq.worker.models.lm import CausalLM
from inferq.worker.window.isolation import run_isolated
from tests.support.generation import greedy_reference
from tests.support.step_events import RecordingEvents

WORDS = ["the", "queue", "worker", "asks", "what", "is", "capital", "of", "France", "token"]


class Harness:
    """A StepLoop on a real engine, recording what it reports to the worker."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events = RecordingEvents()
        self.errors = self.events.errors
        self.ooms = self.events.ooms
        self.changed = self.events.changed
        self.finished: list[Generation] = []
        self.loop = StepLoop(engine, self.events)

    def failed(self) -> list[Generation]:
        return [g for _, victims in self.errors for g in victims]

    def collect(self, timeout: float) -> None:
        """Take the outputs there are, or wait for the next step (as the worker's publisher:
        ``outputs_ready`` fires only after a ``take_outputs(arm=True)`` that found none)."""
        outs = self.loop.take_outputs(arm=True)
        if not outs:
            assert self.changed.wait(timeout), "the step loop stopped making progress"
            self.changed.clear()
        for out in outs:
            self.finished.extend(out.finished)

    def run(self, generations: Sequence[Generation], timeout: float = 60) -> None:
        self.loop.start()
        self.loop.submit(generations)
        expected = {g.id for g in generations}
        try:
            while {g.id for g in (*self.finished, *self.failed())} != expected:
                self.collect(timeout)
        finally:
            self.loop.stop()
            self.loop.join(10)


def make(engine: Engine, lm: CausalLM, n: int, *, seed: int = 0,
         max_new: tuple[int, int] = (8, 30)) -> list[Generation]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))
        params = GenerationParams(max_new_tokens=rng.randint(*max_new), ignore_eos=True)
        out.append(engine.new_generation(f"r{i}", lm.tokenizer(text)["input_ids"], params,
                                         order=i))
    return out


def assert_exact(lm: CausalLM, generations: Sequence[Generation]) -> None:
    for g in generations:
        assert g.finish is FinishReason.LENGTH, g.id
        assert g.tokens == greedy_reference(lm, g.prompt_ids, g.params.max_new_tokens,
                                            ignore_eos=True), g.id
        assert g.detok.text == lm.decode(g.tokens)


def inject(engine: Engine, phase: str,
           fails: Callable[[list[Generation]], Exception | None]) -> None:
    """Make ``engine._prefill`` or ``engine._decode`` raise what ``fails(sequences)`` returns."""
    real = getattr(engine, phase)

    def wrapped(sequences: list[Generation]) -> None:
        exc = fails(sequences)
        if exc is not None:
            raise exc
        real(sequences)

    setattr(engine, phase, wrapped)


def test_a_request_that_breaks_its_prefill_fails_alone(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=8, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 10)
    poison = gens[3]
    inject(engine, "_prefill", lambda seqs: RuntimeError("bad input") if poison in seqs
           else None)
    h = Harness(engine)
    h.run(gens)
    assert h.failed() == [poison]
    assert_exact(lm, [g for g in gens if g is not poison])


def test_a_request_that_breaks_decoding_fails_alone_and_the_others_resume(
        lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=8, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 8, seed=1, max_new=(20, 30))
    poison = gens[5]
    # Fails from its 4th token on, in the batch and alone: decode steps with it raise; its own
    # prefill (recomputing 4+ tokens) then raises too, so it is found.
    def broken(seqs: list[Generation]) -> Exception | None:
        return (RuntimeError("NaN logits") if poison in seqs and len(poison.tokens) >= 4
                else None)

    inject(engine, "_decode", broken)
    inject(engine, "_prefill", broken)
    h = Harness(engine)
    h.run(gens)
    assert h.failed() == [poison]
    survivors = [g for g in gens if g is not poison]
    assert_exact(lm, survivors)  # resumed by recomputation, token for token
    assert all(g.failures == 1 for g in survivors)


def test_a_sequence_that_only_fails_in_company_gives_up_after_bounded_tries(
        lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 3, seed=2, max_new=(30, 30))
    inject(engine, "_decode", lambda seqs: RuntimeError("flaky") if len(seqs) > 1 else None)
    h = Harness(engine)
    h.run(gens)
    # Every decode in company fails: all three are suspects, resumed alone, fail again when
    # they meet, and stop after MAX_STEP_FAILURES failed steps, or finish alone.
    assert all(g.failures <= MAX_STEP_FAILURES for g in gens)
    assert {g.id for g in h.failed()} | {g.id for g in h.finished} == {g.id for g in gens}
    assert len(h.errors) >= 1


def test_out_of_memory_in_decode_shrinks_the_batch_and_loses_nothing(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=8, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 12, seed=3)
    inject(engine, "_decode", lambda seqs: torch.OutOfMemoryError("CUDA out of memory")
           if len(seqs) > 3 else None)
    h = Harness(engine)
    h.run(gens)
    assert h.errors == []
    assert h.ooms and engine.budget.max_slots <= 3
    assert_exact(lm, gens)


def test_out_of_memory_in_prefill_spreads_admissions_and_loses_nothing(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=8, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 10, seed=4)
    inject(engine, "_prefill", lambda seqs: DeviceOutOfMemory("prefill too large")
           if len(seqs) > 1 and sum(g.prefill_tokens for g in seqs) > 40 else None)
    h = Harness(engine)
    h.run(gens)
    assert h.errors == [] and h.ooms
    assert engine.budget.max_prefill_tokens <= 40
    assert_exact(lm, gens)


def test_a_request_too_large_for_the_device_alone_fails_with_out_of_memory(
        lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 1, seed=5)
    inject(engine, "_prefill", lambda seqs: torch.OutOfMemoryError("CUDA out of memory"))
    h = Harness(engine)
    h.run(gens)
    (exc, victims), = h.errors
    assert victims == gens
    failure = failure_of(exc)
    assert failure.error.code == "out_of_memory" and failure.retryable


def test_torch_out_of_memory_is_recognised_and_splits_an_embedding_batch() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("x"))
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(DeviceOutOfMemory("x"))
    assert not is_out_of_memory(RuntimeError("out of memory"))
    split: list[int] = []

    def forward(items: Sequence[int]) -> list[int]:
        if len(items) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [i * 10 for i in items]

    assert run_isolated(forward, list(range(8)), on_oom=lambda items: split.append(len(items))
                        ) == [i * 10 for i in range(8)]
    assert split == [8, 4, 4]


def test_stopping_still_finishes_sequences_pushed_out_by_a_failure(lm: CausalLM) -> None:
    engine = Engine(lm, Budget(max_slots=4, kv_tokens=1 << 20, max_prefill_tokens=4096))
    gens = make(engine, lm, 3, seed=6, max_new=(25, 25))
    tripped = threading.Event()

    def once(seqs: list[Generation]) -> Exception | None:
        if len(seqs) > 1 and all(g.tokens for g in seqs) and not tripped.is_set():
            tripped.set()
            return torch.OutOfMemoryError("CUDA out of memory")
        return None

    inject(engine, "_decode", once)
    h = Harness(engine)
    h.loop.start()
    h.loop.submit(gens)
    while not tripped.is_set():
        h.collect(30)
    h.loop.stop()  # the pushed-out sequences already streamed tokens: they must finish here
    h.loop.join(30)
    for out in h.loop.take_outputs(arm=False):
        h.finished.extend(out.finished)
    assert not h.loop.take_waiting() and h.errors == []
    assert_exact(lm, h.finished)
    assert {g.id for g in h.finished} == {g.id for g in gens}
