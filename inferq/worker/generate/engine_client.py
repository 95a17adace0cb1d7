"""The worker's side of the engine process: ``EngineProcess`` spawns the engine core
(``engine_core``) and stands in for a ``StepLoop`` (see ``engine``'s docstring for why the
model runs in a process of its own).

The weights are loaded in the engine process only: the worker process holds a ``CausalLM``
without them (the tokenizer and configs, for prompts). The child loads the model, then sizes the
KV budget from ``GenerationSettings`` (``wire.EngineSpec.settings``) as a thread would, and sends
it in its ``Ready``; ``EngineProcess`` hands it to the worker (``events.ready``) before
``capacity`` may be more than 0, so the worker claims nothing, and checks nothing, under the
stand-in budget it holds until then. A new engine process after a crash sends its budget again.

``EngineProcess`` has the methods of ``StepLoop`` and reports to the same ``events`` interface
(plus ``ready`` and ``died``). The two processes talk over one ``multiprocessing`` pipe, in the
typed messages of ``wire``. The worker's reader thread turns messages back into
``StepOutput``s of its own ``Generation`` objects (tokens, timings, preemptions, finish), which
the publisher writes as it would a thread's.

If the engine process dies (killed, out of host memory, a crash in native code), the reader
sees the pipe close at once: the worker fails the generations that had started (``retry``
while attempts remain; the next attempt runs alone and goes on from its streamed tokens) and
gives the others back to the queue, logs the exit code or signal, and starts a new engine
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from inferq.protocol.codec import ErrorInfo
from inferq.protocol.generation import FinishReason
from inferq.worker.core.failures import Failure
from inferq.worker.generate import wire
from inferq.worker.generate.engine import Generation
from inferq.worker.generate.engine_core import child_main
from inferq.worker.generate.events import EngineEvents
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.steploop import StepOutput
from inferq.worker.generate.wire import EngineSpec

log = logging.getLogger("inferq.worker")

#: The longest wait between starts of an engine process that keeps dying before it is ready.
RESTART_BACKOFF_MAX_S = 30.0


def describe_exit(code: int | None) -> str:
    if code is None:
        return "its pipe closed"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"


class EngineProcess:
    """The worker's handle on the engine process (the interface of ``StepLoop``)."""

    def __init__(self, spec: EngineSpec, events: EngineEvents) -> None:
        self.spec = spec
        self.events = events
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        #: Every generation the engine holds, by id; which of them it runs.
        self._held: dict[str, Generation] = {}
        self._running: dict[str, Generation] = {}
        self._outputs: list[StepOutput] = []
        self._armed = False
        self._ready = False
        self._stopping = False
        #: The budget the engine process sized after loading the weights (its ``Ready``);
        #: None until the first one is ready.
        self.budget: Budget | None = None
        self._state = wire.EngineState(running=0, due=0, max_slots=0, step=0)
        self._held_identities: list[str] = []
        self.held_version = 0
        #: Steps the engine finished between a cancellation's arrival there and its effect,
        #: as it reported them (``StepLoop.cancel_lags``).
        self.cancel_lags: deque[int] = deque(maxlen=64)
        self._seq = itertools.count()
        self._withdrawals: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._stopped = threading.Event()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self.restarts = 0
        self._failed_starts = 0
        self._handlers: dict[type[Any], Callable[[Any], bool | None]] = {
            wire.Steps: self._on_steps, wire.Capacity: self._on_capacity,
            wire.Cancelled: self._on_cancelled, wire.Failed: self._on_failed,
            wire.OutOfMemory: self._on_out_of_memory, wire.Withdrawn: self._on_withdrawn,
            wire.Ready: self._on_ready, wire.Stopped: self._on_stopped,
        }

    # ------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=child_main, args=(child, self.spec), name="inferq-engine",
                           daemon=True)
        proc.start()
        self._proc = proc  # started: it has a pid
        child.close()
        self._conn = parent
        self._ready = False
        self._reader = threading.Thread(target=self._read, args=(parent, proc),
                                        name="inferq-engine-reader", daemon=True)
        self._reader.start()
        log.info("engine process %d started (%s on %s)", proc.pid, self.spec.model_id,
                 self.spec.device)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else int(proc.pid)

    def stop(self) -> None:
        """Finish the running sequences, admit nothing new, then end the engine process."""
        with self._lock:
            self._stopping = True
        if not self._send(wire.Stop()):
            self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        self._stopped.wait(timeout)
        if self._proc is not None:
            self._proc.join(timeout)

    # ------------------------------------------------------------- StepLoop's interface

    def submit(self, generations: Sequence[Generation]) -> None:
        if not generations:
            return
        with self._lock:
            for g in generations:
                self._held[g.id] = g
        self._send(wire.Submit([wire.GenerationSpec(
            g.id, g.prompt_ids, g.params.model_dump(), g.priority, g.order, g.alone,
            g.tokens, g.detok.text[:g.detok.emitted], g.trace_headers, list(g.identities))
            for g in generations]))

    def cancel(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self._send(wire.Cancel(list(request_ids)))

    def take_outputs(self, *, arm: bool) -> list[StepOutput]:
        with self._lock:
            out, self._outputs = self._outputs, []
            self._armed = arm and not out
            return out

    def capacity(self) -> int:
        with self._lock:
            if not self._ready or self._stopping:
                return 0
            if any(g.alone for g in self._held.values()):
                return 0
            waiting = len(self._held) - len(self._running)
            state = self._state
            return state.max_slots - state.running + state.due - waiting

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def max_slots(self) -> int:
        """The engine's slots now (less than the budget's after an out-of-memory error)."""
        with self._lock:
            return self._state.max_slots

    @property
    def waiting_count(self) -> int:
        with self._lock:
            return len(self._held) - len(self._running)

    @property
    def step(self) -> int:
        """The engine's step count, as it last reported it."""
        return self._state.step

    def _adopt(self, state: wire.EngineState) -> None:
        """(Holding the lock.) The engine's state as its last message reported it."""
        self._state = state
        if state.held is not None:
            self._held_identities = state.held
            self.held_version += 1

    def prefix_state(self) -> tuple[int, list[str], int, int]:
        """The prefix cache as the engine last reported it: (a version that changes with
        the identities held, those identities, prompt tokens, reused tokens)."""
        with self._lock:
            state = self._state
            return (self.held_version, self._held_identities, state.prefix_prompt_tokens,
                    state.prefix_reused_tokens)

    @property
    def engine_stats(self) -> tuple[float, int]:
        """(KV cache usage 0..1, requests vLLM preempted itself), as the engine last reported
        (``--engine vllm``; (0.0, 0) with the transformers engine)."""
        state = self._state
        return state.kv_usage, state.engine_preemptions

    @property
    def device_memory(self) -> tuple[int, int]:
        """(allocated, reserved) CUDA bytes in the engine process, as it last reported."""
        state = self._state
        return state.device_allocated, state.device_reserved

    def held(self) -> tuple[list[Generation], list[Generation]]:
        """(running, waiting), as this process last heard."""
        with self._lock:
            return (list(self._running.values()),
                    [g for i, g in self._held.items() if i not in self._running])

    async def withdraw(self, predicate: Callable[[Generation], bool] | None = None
                       ) -> list[Generation]:
        """Take waiting generations back from the engine (all, or those matching
        ``predicate``): those it had not admitted yet, or had preempted."""
        with self._lock:
            wanted = [g.id for i, g in self._held.items()
                      if i not in self._running and (predicate is None or predicate(g))]
            if not wanted:
                return []
            if self._stopped.is_set():
                return [self._held.pop(i) for i in wanted]
            seq = next(self._seq)
            loop = asyncio.get_running_loop()
            future: asyncio.Future[Any] = loop.create_future()
            self._withdrawals[seq] = (loop, future)
        if not self._send(wire.Withdraw(seq, wanted)):
            with self._lock:
                self._withdrawals.pop(seq, None)
            return []
        taken: list[str] = await future
        with self._lock:
            return [self._held.pop(i) for i in taken if i in self._held]

    # ---------------------------------------------------------------------- internals

    def _send(self, message: wire.ToEngine) -> bool:
        conn = self._conn
        if conn is None:
            return False
        data = wire.encode(message)
        try:
            with self._send_lock:
                conn.send_bytes(data)
        except (OSError, ValueError):
            return False  # the engine is gone: the reader reports it
        return True

    def _read(self, conn: Connection, proc: Any) -> None:
        try:
            while True:
                message = wire.decode_to_worker(conn.recv_bytes())
                try:
                    if self._handlers[type(message)](message):
                        return
                except Exception:  # a bug here must not silence the engine
                    log.exception("engine message %s could not be handled",
                                  type(message).__name__)
        except (EOFError, OSError):
            pass
        proc.join(5)
        self._died(describe_exit(proc.exitcode))

    def _on_capacity(self, message: wire.Capacity) -> None:
        with self._lock:
            self._adopt(message.state)
        self.events.capacity_changed()

    def _on_cancelled(self, message: wire.Cancelled) -> None:
        with self._lock:
            gone = [g for i in message.ids if (g := self._held.pop(i, None)) is not None]
            for g in gone:
                if self._running.pop(g.id, None) is not None:
                    g.finish = FinishReason.CANCELLED
                    g.row = -1
            self.cancel_lags.append(message.lag_steps)
        self.events.left(gone)

    def _on_failed(self, message: wire.Failed) -> None:
        with self._lock:
            victims = [g for i in message.ids if (g := self._held.pop(i, None)) is not None]
            for g in victims:
                self._running.pop(g.id, None)
        failure = Failure(ErrorInfo(code=message.code, message=message.message),
                          message.retryable)
        self.events.step_failed(failure, victims)

    def _on_out_of_memory(self, message: wire.OutOfMemory) -> None:
        self.events.out_of_memory(message.sequences)

    def _on_withdrawn(self, message: wire.Withdrawn) -> None:
        with self._lock:
            loop, future = self._withdrawals.pop(message.seq)
        loop.call_soon_threadsafe(_resolve, future, message.ids)

    def _on_ready(self, message: wire.Ready) -> None:
        spec = message.budget
        budget = Budget(spec.max_slots, spec.kv_tokens, spec.max_prefill_tokens)
        # The worker adopts it before capacity() can say > 0: nothing is claimed under
        # another budget.
        self.events.ready(budget)
        with self._lock:
            self.budget = budget
            self._ready = True
            # A new engine runs nothing yet.
            self._state = wire.EngineState(running=0, due=0, max_slots=budget.max_slots,
                                           step=0)
        log.info("engine process %d ready (it loaded %s in %.1f s)", self.pid,
                 self.spec.model_id, message.load_s)
        self.events.capacity_changed()

    def _on_stopped(self, message: wire.Stopped) -> bool:
        with self._lock:
            for i in message.waiting:
                self._running.pop(i, None)
        self._stopped.set()
        return True

    def _on_steps(self, message: wire.Steps) -> None:
        outs: list[StepOutput] = []
        with self._lock:
            self._adopt(message.state)
            for record in message.steps:
                out = self._apply(record)
                out.delivered = message.state.step
                outs.append(out)
            lost = [i for i in self._running if self.events.is_lost(i)]
            self._outputs += outs
            notify, self._armed = self._armed, False
        if lost:
            self.cancel(lost)
        if notify:
            self.events.outputs_ready()
        if any(out.finished for out in outs):
            self.events.capacity_changed()

    def _apply(self, record: wire.StepRecord) -> StepOutput:
        """(Holding the lock.) One step of the engine on this process' generations."""
        now = record.at
        preempted: list[Generation] = []
        for i in record.preempted:
            if (g := self._running.pop(i, None)) is not None:
                g.preemptions += 1
                g.row = -1
                preempted.append(g)
        entered: list[Generation] = []
        for i in record.admitted:
            if (g := self._held.get(i)) is None:
                continue  # withdrawn or failed meanwhile
            self._running[i] = g
            g.entered = record.step
            entered.append(g)
            if g.admitted_at is None:
                g.admitted_at = now
        rows: list[tuple[Generation, int, str]] = []
        size = len(record.advanced)
        for row in record.advanced:
            if (g := self._held.get(row.id)) is None:
                continue
            g.tokens.append(row.token)
            g.count_step(size, now)
            rows.append((g, row.token, row.text))
        done: list[Generation] = []
        for end in record.finished:
            if (g := self._held.pop(end.id, None)) is None:
                continue
            self._running.pop(end.id, None)
            g.finish = FinishReason(end.finish)
            g.finished_at = now
            g.detok.text = end.text
            g.logprob_output = end.logprobs
            g.row = -1
            done.append(g)
        return StepOutput(rows, done, len(record.admitted), record.prefill_tokens,
                          record.elapsed_s, entered, now, preempted, record.step)

    def _died(self, why: str) -> None:
        with self._lock:
            held, self._held, self._running = self._held, {}, {}
            was_ready, self._ready = self._ready, False
            self._conn = None
            stopping = self._stopping
            for loop, future in self._withdrawals.values():
                loop.call_soon_threadsafe(_resolve, future, [])
            self._withdrawals.clear()
        started = [g for g in held.values() if g.steps or g.admitted_at is not None]
        unstarted = [g for g in held.values() if g not in started]
        self.events.died(why, started, unstarted)
        if stopping:
            self._stopped.set()
            return
        self.restarts += 1
        if not was_ready:
            # It died before it could serve (a model that does not load, no memory): try
            # again, less and less often, rather than in a tight loop.
            self._failed_starts += 1
            delay = min(RESTART_BACKOFF_MAX_S, 0.5 * 2 ** self._failed_starts)
            log.error("engine process died before it was ready; next start in %.1f s", delay)
            time.sleep(delay)
        else:
            self._failed_starts = 0
        self.start()


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
