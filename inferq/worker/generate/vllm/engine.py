"""vLLM's engine where inferq's own stands: ``VllmEngine`` is the ``Engine`` the step loop drives.

``StepLoop`` keeps doing what it does for the transformers engine, at every step boundary:
cancellations and lost leases leave, waiting generations are admitted in inferq's priority
order, a higher priority preempts the lowest running one, a generation that may have crashed a
worker runs alone. Here each of those becomes a call on vLLM's in-process ``LLMEngine``
(``core``):

* admitting a generation is ``add_request`` with its prompt token ids (plus, when it resumes,
  the tokens it already streamed: a token prompt, ``max_tokens`` reduced by as many), its
  sampling parameters mapped one to one (``sampling.sampling_kwargs``) and its priority
  (vLLM serves the lowest value first: inferq priority ``p`` is vLLM priority ``-p``, with
  ``scheduling_policy="priority"``);
* a step is ``core.step()``: each request's new token ids (``RequestOutputKind.DELTA``), which
  inferq detokenizes and checks for stop strings itself (``Engine._accept``), so its stream
  and the text it shows are the transformers engine's;
* cancelling, and finishing first on inferq's side, is ``abort_request``; vLLM reports nothing
  for an aborted request, so the step loop's own report (``left``) is the outcome;
* preempting is ``abort_request`` too, and resuming is a new ``add_request`` from the streamed
  tokens (recomputation): vLLM 0.32 preempts for priority only when its KV cache runs out,
  not when its sequence slots are full, so inferq makes the room itself (``scheduler.plan``).
  Greedy output is the same as without preemption; a sampled one goes on from its tokens with
  a sampler seeded again.

What the worker may claim comes from vLLM's scheduler (``slots_now``: its running and waiting
counts and KV usage, read by a stat logger after each step), so the backlog stays in Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from inferq.protocol.generation import FinishReason
from inferq.worker.generate import scheduler
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.vllm.capacity import SchedulerState, usable_slots
from inferq.worker.generate.vllm.sampling import sampling_kwargs
from inferq.worker.models.lm import CausalLM
from inferq.worker.models.sampling import seed_for

log = logging.getLogger("inferq.worker")

#: vLLM's finish reasons as inferq's (anything else ends the sequence as by length).
FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class CompletionLike(Protocol):
    token_ids: Sequence[int]
    finish_reason: str | None


class OutputLike(Protocol):
    request_id: str
    outputs: Sequence[CompletionLike]
    finished: bool


class CoreLike(Protocol):
    """What ``VllmEngine`` calls on vLLM's ``LLMEngine`` (tests pass a fake with it)."""

    def add_request(self, request_id: str, prompt: Any, params: Any, *,
                    trace_headers: Mapping[str, str] | None = None,
                    priority: int = 0) -> Any: ...
    def abort_request(self, request_ids: list[str]) -> None: ...
    def step(self) -> Sequence[Any]: ...


class MultiTokenStep(RuntimeError):
    """vLLM emitted more than one token for a request in one step (speculative decoding):
    the step fails (its sequences are admitted again, then fail alone) rather than lose
    tokens from the stream."""


class VllmStats:
    """vLLM's scheduler state and preemption count, as its stat logger last recorded them
    (written on the step thread, read anywhere)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = SchedulerState()
        #: Requests vLLM itself preempted (KV cache exhausted), since the engine started.
        self.preemptions = 0

    def record(self, state: SchedulerState | None, preempted: int) -> None:
        with self._lock:
            if state is not None:
                self.state = state
            self.preemptions += preempted


@dataclass(frozen=True, slots=True)
class Requests:
    """How vLLM's request objects are built: ``sampling(**kwargs)`` and ``prompt(ids)``
    (``vllm.SamplingParams`` with delta outputs, ``vllm.inputs.TokensPrompt``)."""

    sampling: Callable[..., Any]
    prompt: Callable[[list[int]], Any]


class VllmEngine(Engine):
    """The step loop's engine over vLLM's ``LLMEngine``. Not thread-safe: one thread steps."""

    def __init__(self, lm: CausalLM, budget: scheduler.Budget, core: CoreLike,
                 requests: Requests, *, stats: VllmStats | None = None,
                 block_size: int = 16, clock: Any = time.monotonic,
                 traces: bool = False) -> None:
        super().__init__(lm, budget, clock=clock)
        self.core = core
        #: vLLM traces (``--vllm-option otlp_traces_endpoint=...``): each request's trace
        #: context goes with it, so vLLM's spans join the request's trace.
        self.traces = traces
        self.requests = requests
        self.stats = stats or VllmStats()
        self.block_size = block_size
        #: Requests given to vLLM and not aborted or finished there.
        self._in_core: set[str] = set()

    # ---------------------------------------------------------------------- capacity

    def slots_now(self) -> int:
        return usable_slots(self.budget.max_slots, len(self.running), self.stats.state)

    def footprint(self, rows: int, longest: int) -> int:
        """Paged KV: at most ``rows`` x the longest reservation, in whole blocks."""
        return rows * -(-longest // self.block_size) * self.block_size

    def select(self, waiting: Sequence[Generation]) -> list[Generation]:
        return scheduler.admit(waiting, [g.reserve_tokens for g in self.running],
                               self._budget_now(), self.footprint)

    def plan(self, waiting: Sequence[Generation], max_preemptions: int
             ) -> scheduler.Plan[Generation, Generation]:
        return scheduler.plan(waiting, self.running, self._budget_now(), self.footprint,
                              max_preemptions=max_preemptions)

    def _budget_now(self) -> scheduler.Budget:
        return replace(self.budget, max_slots=max(1, self.slots_now()))

    # ------------------------------------------------------------------------- steps

    def step(self, admitted: Sequence[Generation] = ()) -> list[Generation]:
        """Add ``admitted`` to vLLM, run one of its steps; the sequences that got a token."""
        if len(self.running) + len(admitted) > self.budget.max_slots:
            raise ValueError("admitting more sequences than there are slots")
        for g in admitted:
            self._add(g)
        outputs = self.core.step()
        self.steps += 1
        now = self.clock()
        by_id = {g.id: g for g in self.running}
        advanced: list[Generation] = []
        for out in outputs:
            seq = by_id.get(out.request_id)
            if seq is None or seq.finish is not None:
                continue  # aborted here meanwhile
            completion = out.outputs[0]
            if len(completion.token_ids) > 1:
                # The step loop streams one token per sequence and step (speculative decoding
                # is refused in ``options``): never drop tokens silently.
                raise MultiTokenStep(f"vLLM gave request {seq.id} {len(completion.token_ids)} "
                                     "tokens in one step")
            for token in completion.token_ids:
                if seq.finish is None:
                    self._accept(seq, int(token))
            if completion.token_ids:
                advanced.append(seq)
            if out.finished:
                self._in_core.discard(seq.id)
                if seq.finish is None:
                    seq.finish = FINISH.get(completion.finish_reason or "",
                                            FinishReason.LENGTH)
        for g in advanced:
            g.count_step(len(advanced), now)
            if g.finish is not None:
                g.detok.flush()
                g.finished_at = now
                self._leave(g)
        self.decoded_tokens += len(advanced)
        return advanced

    def _add(self, g: Generation) -> None:
        left = g.max_new - len(g.tokens)
        seed = None if g.params.greedy else seed_for(g.id, g.params)
        params = self.requests.sampling(**sampling_kwargs(g.params, max_tokens=left, seed=seed))
        self.core.add_request(g.id, self.requests.prompt(list(g.prefill_ids)), params,
                              priority=-g.priority,
                              **({"trace_headers": g.trace_headers}
                                 if self.traces and g.trace_headers else {}))
        self._in_core.add(g.id)
        g.row, g.length, g.entered = 0, len(g.prefill_ids), self.steps
        if g.admitted_at is None:
            g.admitted_at = self.clock()
        self.running.append(g)

    def cancel(self, generation: Generation) -> None:
        if generation.in_batch:
            generation.finish = FinishReason.CANCELLED
            generation.finished_at = self.clock()
            self._leave(generation)

    def preempt(self, generation: Generation, *, swap: bool) -> None:
        """Abort it in vLLM; it keeps its tokens and is added again from them when it resumes
        (no swap: vLLM's blocks are its own)."""
        if generation.in_batch:
            self._leave(generation)
            generation.length = 0
            generation.preemptions += 1

    def clear(self) -> list[Generation]:
        dropped = list(self.running)
        for g in dropped:
            self._leave(g)
        return dropped

    def _leave(self, generation: Generation) -> None:
        if generation.id in self._in_core:
            self._in_core.discard(generation.id)
            self.core.abort_request([generation.id])
        if generation in self.running:
            self.running.remove(generation)
        generation.row = -1

    @property
    def in_core(self) -> int:
        """Requests vLLM holds for this engine."""
        return len(self._in_core)
