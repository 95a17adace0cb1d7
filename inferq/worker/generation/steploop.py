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
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferq.worker.generation.engine import Engine, Generation

log = logging.getLogger("inferq.worker")


@dataclass(slots=True)
class StepOutput:
    #: Every sequence that advanced, with the text its step made visible (maybe '').
    advanced: list[tuple[Generation, str]]
    #: The sequences that finished in this step (they have left the batch).
    finished: list[Generation]
    admitted: int
    prefill_tokens: int
    elapsed_s: float


class StepLoop:
    def __init__(self, engine: Engine, *,
                 on_step: Callable[[], object],
                 on_error: Callable[[Exception, list[Generation]], object],
                 on_cancelled: Callable[[list[Generation]], object],
                 on_capacity: Callable[[], object],
                 is_lost: Callable[[str], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._on_step = on_step
        self._on_error = on_error
        self._on_cancelled = on_cancelled
        self._on_capacity = on_capacity
        self._is_lost = is_lost
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: list[Generation] = []
        self._cancel: set[str] = set()
        self._halt = False
        self._due = 0
        self._running = 0
        #: Step outputs not yet taken by the event loop; ``on_step`` is called only when the
        #: event loop asked to be told (``arm``), not after every step: a tiny model steps
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
            self._cond.notify()

    def take_outputs(self, *, arm: bool) -> list[StepOutput]:
        """Outputs so far, oldest first; with ``arm``, ``on_step`` fires at the next one if
        there is none now."""
        with self._cond:
            out = list(self._outputs)
            self._outputs.clear()
            self._armed = arm and not out
            return out

    def capacity(self) -> int:
        """Slots that will be free at the next step boundary and that no claimed request
        waits for: what the event loop may claim now."""
        with self._cond:
            return self.engine.budget.max_slots - self._running + self._due - len(self._waiting)

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def take_waiting(self, predicate: Callable[[Generation], bool] | None = None
                     ) -> list[Generation]:
        """Remove (and return) waiting generations, all or those matching ``predicate``."""
        with self._cond:
            taken = [g for g in self._waiting if predicate is None or predicate(g)]
            self._waiting = [g for g in self._waiting if g not in taken]
            return taken

    def stop(self) -> None:
        """Finish the running sequences, admit nothing more, then end the thread."""
        with self._cond:
            self._halt = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # -------------------------------------------------------------------- model thread

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                cancelled = self._apply_cancels()
                admitted = [] if self._halt else engine.select(self._waiting)
                for g in admitted:
                    self._waiting.remove(g)
                idle = not engine.running and not admitted
                if idle:
                    self._running, self._due = 0, 0
                else:
                    self._running = len(engine.running) + len(admitted)
                    self._due = sum(1 for g in (*engine.running, *admitted)
                                    if len(g.tokens) + 1 >= g.max_new)
            if cancelled:
                self._on_cancelled(cancelled)
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
                self._on_capacity()
            started = self._clock()
            try:
                advanced = engine.step(admitted)
            except Exception as exc:
                victims = engine.clear()
                victims += [g for g in admitted if g not in victims]
                with self._cond:
                    self._running, self._due = 0, 0
                self._on_error(exc, victims)
                continue
            elapsed = self._clock() - started
            out = [(g, g.detok.delta(final=g.finish is not None)) for g in advanced]
            finished = [g for g in advanced if g.finish is not None]
            with self._cond:
                self._running, self._due = len(engine.running), 0
                self._outputs.append(StepOutput(out, finished, len(admitted),
                                                sum(g.prompt_tokens for g in admitted),
                                                elapsed))
                notify, self._armed = self._armed, False
            if notify:
                self._on_step()
            if finished:
                self._on_capacity()

    def _apply_cancels(self) -> list[Generation]:
        """(Holding the lock.) Sequences cancelled or whose lease was lost leave now."""
        cancel, self._cancel = self._cancel, set()
        gone = [g for g in self.engine.running if g.id in cancel or self._is_lost(g.id)]
        for g in gone:
            self.engine.cancel(g)
        dropped = [g for g in self._waiting if g.id in cancel or self._is_lost(g.id)]
        if dropped:
            self._waiting = [g for g in self._waiting if g not in dropped]
        return gone + dropped
