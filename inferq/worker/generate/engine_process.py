"""The engine core in a child process: the model, its KV cache and the step loop (``StepLoop``
over ``Engine``: scheduler, admission, sampling, detokenization, stop strings) run in a process
of their own; the worker process keeps claims, stream writes, results, leases, cancellation
and metrics (see ``engine``'s docstring for why).

The weights are loaded here only: the worker process holds a ``CausalLM`` without them (the
tokenizer and configs, for prompts). The child loads the model, then sizes the KV budget from
``GenerationSettings`` (``EngineSpec.settings``) as a thread would, after the weights (on CUDA,
a share of the memory they leave free), and sends it in its ``ready``; ``EngineProcess`` hands it to
the worker (``events.ready``) before ``capacity`` may be more than 0, so the worker claims nothing,
and checks nothing, under the stand-in budget it holds until then. A new engine process after
a crash sends its budget again.

``EngineProcess`` is what the worker holds in place of a ``StepLoop``, with the same methods,
and it reports to the same ``events`` interface (plus ``ready`` and ``died``). The two
processes talk over one ``multiprocessing`` pipe, in the typed messages of ``wire`` (one type
per kind, dispatched through a table on each side).

In the engine process one thread sends: the sender. The step loop's events (a cancellation
applied, capacity, a failed step) and the replies of the pipe reader are queued in the outbox
behind the step outputs that came before them, and the sender writes them in that order,
merging every step output that queued meanwhile into one ``Steps`` message: a busy worker costs
the model nothing but a pipe write per message, and the step thread never waits for the pipe.
The sender is the only consumer of the step loop's outputs that arms it (asks to be woken by
the next output); whatever takes outputs otherwise wakes the sender, which takes and arms
again, so no output waits for a later event to leave. The worker's reader thread turns
messages back into ``StepOutput``s of its own ``Generation`` objects (tokens, timings,
preemptions, finish), which the publisher writes as before.

If the engine process dies (killed, out of host memory, a crash in native code), the reader
sees the pipe close at once: the worker fails the generations that had started (``retry``
while attempts remain; the next attempt runs alone and goes on from its streamed tokens) and
gives the others back to the queue, logs the exit code or signal, and starts a new engine
process. The engine ignores SIGINT/SIGTERM (the worker decides when it drains) and exits when
the worker's end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from inferq.protocol.codec import ErrorInfo
from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.core.failures import Failure, failure_of
from inferq.worker.generate import wire
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.events import EngineEvents
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.settings import GenerationSettings, describe_budget
from inferq.worker.generate.steploop import StepLoop, StepOutput

log = logging.getLogger("inferq.worker")

#: The interpreter's switch interval in the engine process (see ``child_main``).
ENGINE_SWITCH_INTERVAL_S = 0.0005
#: The longest wait between starts of an engine process that keeps dying before it is ready.
RESTART_BACKOFF_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine process loads: the model (as ``CausalLM`` takes it), and the settings
    it sizes its budget from once the weights are loaded."""

    path: str
    device: str
    #: As asked for (``auto``, ``float32``...): resolved here, after the device is in use.
    dtype: str
    model_id: str
    settings: GenerationSettings
    torch_threads: int
    log_level: int
    #: ``transformers`` (``Engine``) or ``vllm`` (``vllm.engine.VllmEngine``), and the vLLM
    #: ``EngineArgs`` given with ``--vllm-option``.
    engine: str = "transformers"
    vllm_options: dict[str, Any] = field(default_factory=dict)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "its pipe closed"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with code {code}"


# ------------------------------------------------------------------------ worker side


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


# ------------------------------------------------------------------------ engine side


def step_record(out: StepOutput) -> wire.StepRecord:
    return wire.StepRecord(
        out.step, out.at, out.elapsed_s, [g.id for g in out.entered], out.prefill_tokens,
        [g.id for g in out.preempted],
        [wire.Advanced(g.id, token, text) for g, token, text in out.advanced],
        [wire.Finished(g.id, (g.finish or FinishReason.LENGTH).value, g.detok.text,
                       g.logprob_output) for g in out.finished])


class Outbox:
    """The engine process' messages to the worker, in order, sent by one thread.

    ``put`` queues an event behind the step outputs taken before it; the sender (``run``)
    takes every queued message and every new step output, arming the step loop when there is
    none, and writes them, in order. Nothing but the sender writes to the pipe."""

    def __init__(self, conn: Connection, steps: StepLoop,
                 state: Callable[[], wire.EngineState]) -> None:
        self.conn = conn
        self.steps = steps
        self.state = state
        self._lock = threading.Lock()
        self._queue: list[wire.ToWorker] = []
        self._wake = threading.Event()
        self._closed = False

    def put(self, message: wire.ToWorker) -> None:
        """Queue ``message`` after the step outputs so far (any thread; never blocks)."""
        with self._lock:
            self._take(arm=False)
            self._queue.append(message)
        self._wake.set()

    def outputs_ready(self) -> None:
        """The step loop's ``outputs_ready``: the armed sender has outputs to send."""
        self._wake.set()

    def close(self, message: wire.ToWorker) -> None:
        """``message`` is the last one: the sender sends it and returns."""
        with self._lock:
            self._take(arm=False)
            self._queue.append(message)
            self._closed = True
        self._wake.set()

    def _take(self, *, arm: bool) -> None:
        """(Holding the lock.) Queue the step outputs so far as one ``Steps`` message."""
        outs = self.steps.take_outputs(arm=arm)
        if outs:
            self._queue.append(wire.Steps([step_record(out) for out in outs], self.state()))

    def run(self) -> None:
        while True:
            with self._lock:
                self._take(arm=not self._closed)
                batch, self._queue = self._queue, []
                last = self._closed
            for message in batch:
                self.conn.send_bytes(wire.encode(message))
            if last:
                return
            if not batch:
                self._wake.wait()
                self._wake.clear()


class _EngineSide:
    """The engine process: a ``StepLoop`` over the model, fed from the pipe; it is the step
    loop's ``StepEvents`` (each event a message in the outbox)."""

    def __init__(self, conn: Connection, spec: EngineSpec) -> None:
        import torch

        from inferq.worker.models.device import resolve_dtype
        from inferq.worker.models.lm import CausalLM

        self.conn = conn
        if spec.torch_threads > 0:
            torch.set_num_threads(spec.torch_threads)
        started = time.monotonic()
        device = torch.device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        swap_bytes = spec.settings.swap_bytes
        self.engine: Engine
        if spec.engine == "vllm":
            from inferq.worker.generate.vllm.load import start_vllm

            # vLLM loads the weights; this process keeps the tokenizer (detokenizing, stops).
            lm = CausalLM(spec.path, device=device, dtype=dtype, model_id=spec.model_id,
                          weights=False)
            self.engine, _ = start_vllm(lm, path=spec.path, dtype=str(dtype).removeprefix(
                "torch."), device=spec.device, settings=spec.settings,
                options=spec.vllm_options)
            swap_bytes = 0  # vLLM's KV blocks are its own: a preempted sequence recomputes
        else:
            lm = CausalLM(spec.path, device=device, dtype=dtype, model_id=spec.model_id)
            # After the weights: on CUDA the KV cache takes a share of the memory they left
            # free.
            self.engine = Engine(lm, spec.settings.budget(lm),
                                 prefix_cache_bytes=spec.settings.prefix_cache_bytes)
        budget = self.engine.budget
        self.load_s = time.monotonic() - started
        log.info("loaded model %s (weights) on %s in %.1f s (%s engine); %s", spec.model_id,
                 lm.device, self.load_s, spec.engine, describe_budget(budget, lm.kv))
        self.steps = StepLoop(self.engine, self, max_preemptions=spec.settings.max_preemptions,
                              swap_bytes=swap_bytes)
        self._held_sent = -1
        self.outbox = Outbox(conn, self.steps, self._state)
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            wire.Submit: self._on_submit, wire.Cancel: self._on_cancel,
            wire.Withdraw: self._on_withdraw, wire.Stop: self._on_stop,
        }

    # ------------------------------------------------------------- StepEvents (to the pipe)

    def outputs_ready(self) -> None:
        self.outbox.outputs_ready()

    def step_failed(self, error: Exception | Failure, victims: list[Generation]) -> None:
        failure = error if isinstance(error, Failure) else failure_of(error)
        self.outbox.put(wire.Failed(failure.error.code, failure.error.message,
                                    failure.retryable, [g.id for g in victims]))

    def left(self, gone: list[Generation]) -> None:
        lags = self.steps.cancel_lags
        self.outbox.put(wire.Cancelled([g.id for g in gone], lags[-1] if lags else 0))

    def capacity_changed(self) -> None:
        self.outbox.put(wire.Capacity(self._state()))

    def out_of_memory(self, sequences: int) -> None:
        self.outbox.put(wire.OutOfMemory(sequences))

    def is_lost(self, request_id: str) -> bool:
        return False  # the worker process knows its leases: it cancels the lost ones

    def loop_failed(self, error: BaseException) -> None:
        # A process whose step loop is gone serves nothing: exit, so the worker sees it die,
        # retries what had started and starts a new engine process.
        os._exit(70)

    # ---------------------------------------------------------------------- the process

    def _state(self) -> wire.EngineState:
        allocated, reserved = self._device_memory()
        kv_usage, preemptions = self._engine_stats()
        prefix = getattr(self.engine, "prefix", None)
        held, prompt, reused = None, 0, 0
        if prefix is not None:
            prompt, reused = prefix.stats.prompt_tokens, prefix.stats.reused_tokens
            if prefix.version != self._held_sent:
                self._held_sent, held = prefix.version, prefix.held()
        return wire.EngineState(running=self.steps.running_count, due=self.steps.due,
                                max_slots=self.engine.slots_now(), step=self.engine.steps,
                                device_allocated=allocated, device_reserved=reserved,
                                kv_usage=kv_usage, engine_preemptions=preemptions,
                                prefix_prompt_tokens=prompt, prefix_reused_tokens=reused,
                                held=held)

    def _engine_stats(self) -> tuple[float, int]:
        """vLLM's KV cache usage and own preemptions ((0.0, 0) for the transformers engine)."""
        from inferq.worker.generate.vllm.engine import VllmEngine

        if not isinstance(self.engine, VllmEngine):
            return 0.0, 0
        stats = self.engine.stats
        return stats.state.kv_usage, stats.preemptions

    def _device_memory(self) -> tuple[int, int]:
        """(allocated, reserved) bytes of CUDA memory in this process (0, 0 on the CPU): the
        worker's ``inferq_device_memory_bytes`` gauges, which it cannot read itself."""
        if self.engine.lm.torch_device.type != "cuda":
            return 0, 0
        import torch

        return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())

    def serve(self) -> None:
        self.steps.start()
        budget = self.engine.budget
        self.outbox.put(wire.Ready(wire.BudgetSpec(budget.max_slots, budget.kv_tokens,
                                                   budget.max_prefill_tokens), self.load_s))
        self._sender = threading.Thread(target=self._send_all, name="inferq-engine-sender",
                                        daemon=True)
        self._sender.start()
        while True:
            message = wire.decode_to_engine(self.conn.recv_bytes())
            self._handlers[type(message)](message)

    def _send_all(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the worker is gone
            self.outbox.run()
            return
        os._exit(0)

    def _on_submit(self, message: wire.Submit) -> None:
        self.steps.submit([self.engine.new_generation(
            spec.id, spec.prompt_ids, GenerationParams(**spec.params), priority=spec.priority,
            order=spec.order, alone=spec.alone, streamed=spec.streamed, shown=spec.shown,
            trace_headers=spec.trace_headers, identities=spec.identities)
            for spec in message.generations])

    def _on_cancel(self, message: wire.Cancel) -> None:
        self.steps.cancel(message.ids)

    def _on_withdraw(self, message: wire.Withdraw) -> None:
        taken = self.steps.take_waiting(partial(_named, set(message.ids)))
        self.outbox.put(wire.Withdrawn(message.seq, [g.id for g in taken]))

    def _on_stop(self, message: wire.Stop) -> None:
        # Drained on a thread of its own: cancellations still arrive meanwhile.
        threading.Thread(target=self._drain, name="inferq-engine-drain", daemon=True).start()

    def _drain(self) -> None:
        self.steps.stop()
        self.steps.join()
        left = self.steps.take_waiting()
        self.outbox.close(wire.Stopped([g.id for g in left]))
        self._sender.join()
        os._exit(0)


def child_main(conn: Connection, spec: EngineSpec) -> None:
    """The engine process' entry point (``multiprocessing`` spawns it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The step loop holds the GIL between its torch calls; the pipe reader (a cancellation,
    # a submission) waits for it at most this long, not the default 5 ms: several decode
    # steps of a small model.
    sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
    logging.basicConfig(level=spec.log_level,
                        format=f"%(asctime)s engine[{os.getpid()}] %(levelname)s %(message)s")
    with contextlib.suppress(EOFError, OSError):  # EOF: the worker is gone
        _EngineSide(conn, spec).serve()
    os._exit(0)


def _named(ids: set[str], g: Generation) -> bool:
    return g.id in ids
