"""The model thread of a ``generate`` worker: ``Engine.step`` back to back, never waiting for
Redis.

The asyncio side hands it claimed generations (``submit``) and cancellations (``cancel``); at
every step boundary the thread applies cancellations and lost leases (the sequence leaves, its
slot is free), admits waiting generations in priority order (``Engine.select``), runs the step
and queues its output for the event loop (``take_outputs``), which streams and completes while
the next steps already run. Before each step it publishes how many slots will be free after it
(``capacity``: free slots, plus sequences that reach ``max_new_tokens`` in this step, minus
those already waiting), so the event loop claims replacements while the step runs and they
join at the very next step.

A failed step loses nothing but what it must. Sequences that leave the batch without finishing
keep their tokens and are admitted again later, prefilling prompt + generated tokens
(recomputation), so their streams go on where they were:

* out of device memory: the budget shrinks (half the sequences that failed, or the prefill
  that failed) and everyone is re-admitted under it; it grows back after a run of good steps.
  Only a sequence that does not fit alone fails (``out_of_memory``, retried by the queue);
* any other error in a prefill of one sequence fails that sequence alone; in a prefill of
  several, or in a decode, every sequence involved becomes a suspect and is admitted again
  alone (one suspect per step, in its own prefill), so the one that fails by itself is found
  and the others continue. A sequence in ``MAX_STEP_FAILURES`` failed steps fails for good.

Priority holds on the device: when a waiting request has strictly higher priority than running
sequences and no room, the lowest of them leave the batch at the step boundary
(``scheduler.plan``), keep their tokens and wait here to be admitted again. Their KV cache is
swapped out to host memory (up to ``swap_bytes`` in all) and put back into a free row when they
resume, so nothing is computed twice; beyond that budget a preempted sequence is recomputed on
resumption (prompt and tokens prefilled, as after an out-of-memory error). Preemption stays in
this process (the worker's lease, stream and sampler go on untouched: a preempted generation
yields the same tokens as one never preempted) and is not an attempt. Each step's output lists
the sequences it preempted; a resumed one is among the next admissions.

A generation marked ``alone`` (the worker marks a request whose previous attempt ended without
a result: its worker may have crashed on it) runs alone: while one waits, nothing new is
admitted and the batch drains; then it runs by itself, nothing joins it until it leaves, and
``capacity`` is 0 meanwhile (the backlog stays in Redis, for other workers). So a request that
crashes workers cannot take other requests' attempts with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from inferq.worker.core.failures import free_device_cache, is_out_of_memory
from inferq.worker.generate.engine import AdmissionFailed, Engine, Generation
from inferq.worker.generate.events import StepEvents
from inferq.worker.generate.scheduler import priority_order

log = logging.getLogger("inferq.worker")

#: A sequence that took part in this many failed steps fails (the queue may retry it).
MAX_STEP_FAILURES = 3
#: Good steps after which a budget shrunk by an out-of-memory error grows one notch back.
RECOVER_AFTER_STEPS = 200
#: Times one sequence may be preempted for a higher priority; then it keeps its slot.
MAX_PREEMPTIONS = 32


@dataclass(slots=True)
class StepOutput:
    #: Every sequence that advanced, with its new token and the text its step made visible
    #: (maybe '').
    advanced: list[tuple[Generation, int, str]]
    #: The sequences that finished in this step (they have left the batch).
    finished: list[Generation]
    admitted: int
    prefill_tokens: int
    elapsed_s: float
    #: The sequences this step admitted, and when it ended (the step loop's clock).
    entered: list[Generation] = field(default_factory=list)
    at: float = 0.0
    #: Running sequences pushed out at this step's boundary for a higher priority.
    preempted: list[Generation] = field(default_factory=list)
    #: The engine's step number (1 for its first step).
    step: int = 0
    #: The engine's step count when this output was handed over (taken from the step loop,
    #: or read from the engine process' pipe): ``delivered - step`` steps ran meanwhile.
    delivered: int = 0


class Steps(Protocol):
    """What the worker drives: ``StepLoop`` (a thread of the worker process) or
    ``engine_client.EngineProcess`` (the same loop in a child process)."""

    def start(self) -> None: ...
    def submit(self, generations: Sequence[Generation]) -> None: ...
    def cancel(self, request_ids: Sequence[str]) -> None: ...
    def take_outputs(self, *, arm: bool) -> list[StepOutput]: ...
    def capacity(self) -> int: ...
    @property
    def running_count(self) -> int: ...
    @property
    def waiting_count(self) -> int: ...
    @property
    def max_slots(self) -> int: ...
    def held(self) -> tuple[list[Generation], list[Generation]]: ...
    def prefix_state(self) -> tuple[int, list[str], int, int]: ...
    @property
    def step(self) -> int: ...
    async def withdraw(self, predicate: Callable[[Generation], bool] | None = None
                       ) -> list[Generation]: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


class StepLoop:
    def __init__(self, engine: Engine, events: StepEvents, *,
                 max_preemptions: int = MAX_PREEMPTIONS, swap_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.events = events
        #: 0: nothing is preempted (admission waits for free room, as before).
        self.max_preemptions = max_preemptions
        #: Host memory the caches of preempted sequences may hold (swapped out); a preemption
        #: beyond it is recomputed on resumption. None: as much as the KV budget.
        self.swap_bytes = (engine.budget.kv_tokens * engine.lm.kv.bytes_per_token
                           if swap_bytes is None else swap_bytes)
        self._full_budget = engine.budget
        self._good_steps = 0
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: list[Generation] = []
        self._cancel: set[str] = set()
        #: The engine's step count when the oldest cancellation not applied yet arrived.
        self._notice_step: int | None = None
        #: Steps the engine finished between a cancellation's arrival and its effect (recent
        #: ones): 0 or 1, as it leaves at the first step boundary after it arrives.
        self.cancel_lags: deque[int] = deque(maxlen=64)
        self._halt = False
        self._due = 0
        self._running = 0
        #: A generation that runs alone is running (see ``_select``).
        self._alone_running = False
        #: Step outputs not yet taken by the event loop; ``outputs_ready`` is called only when
        #: the event loop asked to be told (``arm``), not after every step: a tiny model steps
        #: every couple of ms, and waking the event loop that often costs the model thread.
        self._outputs: deque[StepOutput] = deque()
        self._armed = False
        self._thread = threading.Thread(target=self._run, name="inferq-generate", daemon=True)

    # ----------------------------------------------------------------- event-loop side

    def start(self) -> None:
        self._thread.start()

    def submit(self, generations: Sequence[Generation]) -> None:
        with self._cond:
            self._waiting.extend(generations)
            self._cond.notify()

    def cancel(self, request_ids: Sequence[str]) -> None:
        with self._cond:
            self._cancel.update(request_ids)
            if self._notice_step is None:
                self._notice_step = self.engine.steps
            self._cond.notify()

    def take_outputs(self, *, arm: bool) -> list[StepOutput]:
        """Outputs so far, oldest first; with ``arm``, ``outputs_ready`` fires at the next one
        if there is none now. Without ``arm`` it will not fire: whoever takes outputs that way
        must come back with ``arm`` (one consumer loops; see ``engine_core``)."""
        with self._cond:
            out = list(self._outputs)
            self._outputs.clear()
            self._armed = arm and not out
            for o in out:
                o.delivered = self.engine.steps
            return out

    def capacity(self) -> int:
        """Slots that will be free at the next step boundary and that no claimed request
        waits for: what the event loop may claim now."""
        with self._cond:
            if self._alone_running or any(g.alone for g in self._waiting):
                return 0
            return self.engine.slots_now() - self._running + self._due - len(self._waiting)

    @property
    def running_count(self) -> int:
        """Sequences in the batch (as of the last step boundary)."""
        return self._running

    @property
    def max_slots(self) -> int:
        """The engine's slots now (less than the budget's after an out-of-memory error)."""
        return self.engine.budget.max_slots

    @property
    def step(self) -> int:
        """The engine's step count."""
        return self.engine.steps

    @property
    def due(self) -> int:
        """Sequences that reach ``max_new_tokens`` in the step in flight."""
        return self._due

    @property
    def waiting_count(self) -> int:
        """Sequences waiting to join the batch (claimed, or preempted)."""
        return len(self._waiting)

    def held(self) -> tuple[list[Generation], list[Generation]]:
        """(running, waiting): the sequences in the batch, and those waiting to join it
        (claimed, or preempted)."""
        with self._cond:
            return list(self.engine.running), list(self._waiting)

    def prefix_state(self) -> tuple[int, list[str], int, int]:
        """The engine's prefix cache: (a version that changes with the identities it holds,
        those identities, prompt tokens admitted, tokens reused); all 0 without one."""
        prefix = getattr(self.engine, "prefix", None)  # the vllm engine has none
        if prefix is None:
            return 0, [], 0, 0
        return (prefix.version, prefix.held(), prefix.stats.prompt_tokens,
                prefix.stats.reused_tokens)

    async def withdraw(self, predicate: Callable[[Generation], bool] | None = None
                       ) -> list[Generation]:
        """``take_waiting``, as ``engine_client.EngineProcess`` offers it."""
        return self.take_waiting(predicate)

    def take_waiting(self, predicate: Callable[[Generation], bool] | None = None
                     ) -> list[Generation]:
        """Remove (and return) waiting generations, all or those matching ``predicate``."""
        with self._cond:
            taken = [g for g in self._waiting if predicate is None or predicate(g)]
            self._waiting = [g for g in self._waiting if g not in taken]
            for g in taken:
                g.swapped = None  # it leaves this engine: so does its saved cache
            return taken

    def stop(self) -> None:
        """Finish the running sequences (and those back after a failed step), admit nothing
        new (a sequence back after a failed step is not new), then end the thread; what still
        waits is for ``take_waiting``."""
        with self._cond:
            self._halt = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -------------------------------------------------------------------- model thread

    def _run(self) -> None:
        try:
            self._steps()
        except BaseException as exc:  # reported (and logged with its traceback), not raised
            log.critical("the step loop failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
            self.events.loop_failed(exc)

    def _steps(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                cancelled = self._apply_cancels()
                admitted, preempted = self._select()
                swapped = sum(g.swap_bytes for g in self._waiting)
                for g in preempted:
                    size = g.length * engine.lm.kv.bytes_per_token
                    engine.preempt(g, swap=swapped + size <= self.swap_bytes)
                    swapped += g.swap_bytes
                self._waiting = [g for g in self._waiting if g not in admitted] + preempted
                idle = not engine.running and not admitted
                self._alone_running = any(g.alone for g in (*engine.running, *admitted))
                if idle:
                    self._running, self._due = 0, 0
                else:
                    self._running = len(engine.running) + len(admitted)
                    self._due = sum(1 for g in (*engine.running, *admitted)
                                    if len(g.tokens) + 1 >= g.max_new)
            if cancelled:
                self.events.left(cancelled)
            if idle:
                with self._cond:
                    if self._halt:
                        return
                    if not self._cancel:
                        # Waiting requests that cannot be admitted into an empty batch do not
                        # exist (the worker refuses them up front); re-check now and then.
                        self._cond.wait(None if not self._waiting else 0.05)
                continue
            if self._due:
                self.events.capacity_changed()
            started = self._clock()
            prefill = sum(g.prefill_tokens for g in admitted)
            try:
                advanced = engine.step(admitted)
            except AdmissionFailed as failed:
                advanced = failed.advanced
                self._admission_failed(failed.rejected, failed.cause)
                admitted, prefill = [], 0
            except Exception as exc:
                victims = engine.clear()
                victims += [g for g in admitted if g not in victims]
                with self._cond:
                    self._running, self._due, self._alone_running = 0, 0, False
                self._step_failed(victims, exc)
                continue
            for g in admitted:
                g.suspect = False
            self._recover()
            elapsed = self._clock() - started
            out = [(g, g.tokens[-1], g.detok.delta(final=g.finish is not None))
                   for g in advanced]
            finished = [g for g in advanced if g.finish is not None]
            with self._cond:
                self._running, self._due = len(engine.running), 0
                self._alone_running = any(g.alone for g in engine.running)
                self._outputs.append(StepOutput(out, finished, len(admitted), prefill,
                                                elapsed, admitted, started + elapsed,
                                                preempted, engine.steps))
                notify, self._armed = self._armed, False
            if notify:
                self.events.outputs_ready()
            if finished:
                self.events.capacity_changed()

    def _select(self) -> tuple[list[Generation], list[Generation]]:
        """(Holding the lock.) The step's admissions and the running sequences they preempt;
        a suspect is prefilled alone, and preempts nothing. Once stopping, only sequences
        that already took steps here (back after a failed step, or preempted) are admitted:
        the others go back to the queue untouched."""
        waiting = [g for g in self._waiting if g.steps] if self._halt else self._waiting
        if any(g.alone for g in self.engine.running):
            return [], []
        alone = [g for g in priority_order(waiting) if g.alone]
        if alone:
            # Nothing joins while the batch drains; then the first of them runs by itself.
            return ([] if self.engine.running else alone[:1]), []
        if any(g.suspect for g in waiting):
            admitted = self.engine.select(waiting)
            suspects = [g for g in admitted if g.suspect]
            return (suspects[:1] if suspects else admitted), []
        plan = self.engine.plan(waiting, self.max_preemptions)
        return plan.admitted, plan.preempted

    def _requeue(self, generations: Sequence[Generation]) -> None:
        if generations:
            with self._cond:
                self._waiting.extend(generations)

    def _shrink(self, *, max_slots: int | None = None, max_prefill: int | None = None) -> None:
        budget = self.engine.budget
        self.engine.budget = replace(
            budget,
            max_slots=max(1, min(budget.max_slots, max_slots or budget.max_slots)),
            max_prefill_tokens=max(1, min(budget.max_prefill_tokens,
                                          max_prefill or budget.max_prefill_tokens)))
        self._good_steps = 0
        free_device_cache(self.engine.lm.device)
        log.warning("out of device memory: now %d slots, %d prefill tokens per step",
                    self.engine.budget.max_slots, self.engine.budget.max_prefill_tokens)

    def _recover(self) -> None:
        budget, full = self.engine.budget, self._full_budget
        if budget == full:
            return
        self._good_steps += 1
        if self._good_steps < RECOVER_AFTER_STEPS:
            return
        self._good_steps = 0
        self.engine.budget = replace(
            budget, max_slots=min(full.max_slots, budget.max_slots + 1),
            max_prefill_tokens=min(full.max_prefill_tokens,
                                   budget.max_prefill_tokens * 5 // 4 + 1))
        self.events.capacity_changed()

    def _step_failed(self, victims: list[Generation], exc: Exception) -> None:
        """A decode (or a whole step) raised; the batch is cleared, ``victims`` are out."""
        if is_out_of_memory(exc) and len(victims) > 1:
            self.events.out_of_memory(len(victims))
            self._shrink(max_slots=len(victims) // 2)
            self._requeue(victims)
            return
        self._isolate(victims, exc)

    def _admission_failed(self, rejected: list[Generation], exc: Exception) -> None:
        """The prefill of ``rejected`` raised; the running sequences are fine."""
        if is_out_of_memory(exc) and (len(rejected) > 1 or self.engine.running):
            self.events.out_of_memory(len(rejected))
            if len(rejected) > 1:
                self._shrink(max_prefill=sum(g.prefill_tokens for g in rejected) // 2)
            else:
                self._shrink(max_slots=len(self.engine.running))
            self._requeue(rejected)
            return
        self._isolate(rejected, exc)

    def _isolate(self, victims: list[Generation], exc: Exception) -> None:
        """Fail a sequence that failed alone; make suspects of several."""
        failed = []
        for g in victims:
            g.failures += 1
            if len(victims) == 1 or g.failures >= MAX_STEP_FAILURES:
                failed.append(g)
            else:
                g.suspect = True
        if failed:
            self.events.step_failed(exc, failed)
        suspects = [g for g in victims if g not in failed]
        if suspects:
            log.warning("a step of %d sequences failed (%s: %s); each is admitted again alone",
                        len(victims), type(exc).__name__, exc)
            self._requeue(suspects)

    def _apply_cancels(self) -> list[Generation]:
        """(Holding the lock.) Sequences cancelled or whose lease was lost leave now."""
        cancel, self._cancel = self._cancel, set()
        if self._notice_step is not None:
            self.cancel_lags.append(self.engine.steps - self._notice_step)
            self._notice_step = None
        is_lost = self.events.is_lost
        gone = [g for g in self.engine.running if g.id in cancel or is_lost(g.id)]
        for g in gone:
            self.engine.cancel(g)
        dropped = [g for g in self._waiting if g.id in cancel or is_lost(g.id)]
        if dropped:
            self._waiting = [g for g in self._waiting if g not in dropped]
            for g in dropped:
                g.swapped = None
        return gone + dropped
