"""The engine core in a child process: the model, its KV cache and the step loop (``StepLoop``
over ``Engine``: scheduler, admission, sampling, detokenization, stop strings) run in a process
of their own; the worker process keeps claims, stream writes, results, leases, cancellation
and metrics (see ``engine``'s docstring for why).

The weights are loaded here only: the worker process holds a ``CausalLM`` without them (the
tokenizer and configs, for prompts). The child loads the model, then sizes the KV budget from
``GenerationSettings`` (``EngineSpec.settings``) as a thread would, after the weights (on CUDA,
a share of the memory they leave free), and sends it in its ``ready``; ``EngineProcess`` hands it to
the worker (``on_ready``) before ``capacity`` may be more than 0, so the worker claims nothing,
and checks nothing, under the stand-in budget it holds until then. A new engine process after
a crash sends its budget again.

``EngineProcess`` is what the worker holds in place of a ``StepLoop``, with the same methods.
The two processes talk over one ``multiprocessing`` pipe, in msgpack messages:

* worker -> engine: ``submit`` (prompt ids, parameters, priority, streamed tokens to go on
  from), ``cancel`` (request ids; also those whose lease was lost), ``withdraw`` (waiting
  requests taken back: expired, or given back on shutdown), ``stop`` (drain);
* engine -> worker: ``steps`` (every step output not sent yet, in one message: each running
  request's new token and text; the finished ones with their final text), ``capacity``,
  ``cancelled``, ``error`` (a step failed for these requests: their ``Failure``), ``oom``,
  ``withdrawn``, ``ready`` (the budget, and how long loading took) and ``stopped``.

The engine sends step outputs as fast as the worker reads them and merges whatever queued
meanwhile into one message, so a busy worker costs the model nothing but a pipe write per
message. The worker's reader thread turns messages back into ``StepOutput``s of its own
``Generation`` objects (tokens, timings, finish), which the publisher writes as before.

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
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from inferq.protocol.codec import ErrorInfo
from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.core.failures import Failure, failure_of
from inferq.worker.generate.engine import Engine, Generation
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


def _pack(message: Any) -> bytes:
    data: bytes = msgpack.packb(message, use_bin_type=True)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


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

    def __init__(self, spec: EngineSpec, *,
                 on_step: Callable[[], object],
                 on_error: Callable[[Failure, list[Generation]], object],
                 on_cancelled: Callable[[list[Generation]], object],
                 on_capacity: Callable[[], object],
                 on_oom: Callable[[int], object],
                 on_died: Callable[[str, list[Generation], list[Generation]], object],
                 on_ready: Callable[[Budget], object],
                 is_lost: Callable[[str], bool]) -> None:
        self.spec = spec
        self._on_ready = on_ready
        self._on_step = on_step
        self._on_error = on_error
        self._on_cancelled = on_cancelled
        self._on_capacity = on_capacity
        self._on_oom = on_oom
        self._on_died = on_died
        self._is_lost = is_lost
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        #: Every generation the engine holds, by id; which of them it runs.
        self._held: dict[str, Generation] = {}
        self._running: dict[str, Generation] = {}
        self._outputs: list[StepOutput] = []
        self._armed = False
        self._ready = False
        self._stopping = False
        #: The budget the engine process sized after loading the weights (its ``ready``); None
        #: until the first one is ready.
        self.budget: Budget | None = None
        self._max_slots = 0
        self._engine_running = 0
        #: (allocated, reserved) CUDA bytes in the engine process, as it last reported.
        self.device_memory = (0, 0)
        #: Steps the engine finished between a cancellation's arrival there and its effect,
        #: as it reported them (``StepLoop.cancel_lags``).
        self.cancel_lags: deque[int] = deque(maxlen=64)
        self._due = 0
        self._seq = itertools.count()
        self._withdrawals: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}
        self._stopped = threading.Event()
        self._proc: Any = None
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self.restarts = 0
        self._failed_starts = 0

    # ------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=child_main, args=(child, self.spec),
                                 name="inferq-engine", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        self._ready = False
        self._reader = threading.Thread(target=self._read, args=(parent, self._proc),
                                        name="inferq-engine-reader", daemon=True)
        self._reader.start()
        log.info("engine process %d started (%s on %s)", self._proc.pid, self.spec.model_id,
                 self.spec.device)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def stop(self) -> None:
        """Finish the running sequences, admit nothing new, then end the engine process."""
        with self._lock:
            self._stopping = True
        if not self._send(("stop",)):
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
        self._send(("submit", [
            [g.id, g.prompt_ids, g.params.model_dump(), g.priority, g.order, g.alone,
             g.tokens, g.detok.text[:g.detok.emitted]] for g in generations]))

    def cancel(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self._send(("cancel", list(request_ids)))

    def take_outputs(self, *, arm: bool) -> list[StepOutput]:
        with self._lock:
            out, self._outputs = self._outputs, []
            self._armed = arm and not out
            return out

    def capacity(self) -> int:
        with self._lock:
            if not self._ready or self._stopping:
                return 0
            waiting = [g for i, g in self._held.items() if i not in self._running]
            if any(g.alone for g in self._held.values()):
                return 0
            return self._max_slots - self._engine_running + self._due - len(waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def max_slots(self) -> int:
        """The engine's slots now (less than the budget's after an out-of-memory error)."""
        with self._lock:
            return self._max_slots

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._held) - len(self._running)

    @property
    def generations(self) -> list[Generation]:
        """The generations running in the engine (as this process last heard)."""
        with self._lock:
            return list(self._running.values())

    async def withdraw(self, predicate: Callable[[Generation], bool] | None = None
                       ) -> list[Generation]:
        """Take waiting generations back from the engine (all, or those matching
        ``predicate``): those it had not admitted yet."""
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
        if not self._send(("withdraw", seq, wanted)):
            with self._lock:
                self._withdrawals.pop(seq, None)
            return []
        taken: list[str] = await future
        with self._lock:
            return [self._held.pop(i) for i in taken if i in self._held]

    # ---------------------------------------------------------------------- internals

    def _send(self, message: Any) -> bool:
        conn = self._conn
        if conn is None:
            return False
        data = _pack(message)
        try:
            with self._send_lock:
                conn.send_bytes(data)
        except (OSError, ValueError):
            return False  # the engine is gone: the reader reports it
        return True

    def _read(self, conn: Connection, proc: Any) -> None:
        try:
            while True:
                message = _unpack(conn.recv_bytes())
                try:
                    if self._handle(message):
                        return
                except Exception:  # a bug here must not silence the engine
                    log.exception("engine message %r could not be handled", message[:1])
        except (EOFError, OSError):
            pass
        proc.join(5)
        self._died(describe_exit(proc.exitcode))

    def _handle(self, message: Any) -> bool:
        """One message from the engine; True once the engine stopped."""
        kind = message[0]
        if kind == "steps":
            self._steps(message[1], message[2])
        elif kind == "capacity":
            with self._lock:
                self._take_state(message[1:])
            self._on_capacity()
        elif kind == "cancelled":
            with self._lock:
                gone = [g for i in message[1] if (g := self._held.pop(i, None)) is not None]
                for g in gone:
                    if self._running.pop(g.id, None) is not None:
                        g.finish = FinishReason.CANCELLED
                        g.row = -1
                self.cancel_lags.append(int(message[2]))
            self._on_cancelled(gone)
        elif kind == "error":
            code, text, retryable, ids = message[1:5]
            with self._lock:
                victims = [g for i in ids if (g := self._held.pop(i, None)) is not None]
                for g in victims:
                    self._running.pop(g.id, None)
            self._on_error(Failure(ErrorInfo(code=code, message=text), retryable), victims)
        elif kind == "oom":
            self._on_oom(message[1])
        elif kind == "withdrawn":
            with self._lock:
                loop, future = self._withdrawals.pop(message[1])
            loop.call_soon_threadsafe(_resolve, future, message[2])
        elif kind == "ready":
            budget = Budget(*message[1])
            # The worker adopts it before capacity() can say > 0: nothing is claimed under
            # another budget.
            self._on_ready(budget)
            with self._lock:
                self.budget = budget
                self._ready = True
                self._max_slots = budget.max_slots
                self._engine_running = self._due = 0  # a new engine runs nothing yet
            log.info("engine process %d ready (it loaded %s in %.1f s)", self.pid,
                     self.spec.model_id, message[2])
            self._on_capacity()
        elif kind == "stopped":
            with self._lock:
                for i in message[1]:
                    self._running.pop(i, None)
            self._stopped.set()
            return True
        return False

    def _take_state(self, state: Sequence[int]) -> None:
        """(Holding the lock.) The engine's slots and device memory, as of its last message."""
        self._engine_running, self._due, self._max_slots = state[:3]
        self.device_memory = (int(state[3]), int(state[4]))

    def _steps(self, steps: list[Any], state: list[int]) -> None:
        outs: list[StepOutput] = []
        lost: list[str] = []
        with self._lock:
            self._take_state(state)
            for now, elapsed, admitted, prefill, advanced, finished in steps:
                for i in admitted:
                    if (g := self._held.get(i)) is None:
                        continue  # withdrawn or failed meanwhile
                    self._running[i] = g
                    if g.admitted_at is None:
                        g.admitted_at = now
                rows: list[tuple[Generation, int, str]] = []
                for i, token, text in advanced:
                    if (g := self._held.get(i)) is None:
                        continue
                    g.tokens.append(token)
                    g.steps += 1
                    g.batch_sum += len(advanced)
                    if g.first_token_at is None:
                        g.first_token_at = now
                    rows.append((g, token, text))
                done: list[Generation] = []
                for i, finish, text in finished:
                    if (g := self._held.pop(i, None)) is None:
                        continue
                    self._running.pop(i, None)
                    g.finish = FinishReason(finish)
                    g.finished_at = now
                    g.detok.text = text
                    g.row = -1
                    done.append(g)
                outs.append(StepOutput(rows, done, len(admitted), prefill, elapsed))
            lost = [i for i in self._running if self._is_lost(i)]
            self._outputs += outs
            notify, self._armed = self._armed, False
        if lost:
            self.cancel(lost)
        if notify:
            self._on_step()
        if any(out.finished for out in outs):
            self._on_capacity()

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
        self._on_died(why, started, unstarted)
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


class _EngineSide:
    """The engine process: a ``StepLoop`` over the model, fed from the pipe."""

    def __init__(self, conn: Connection, spec: EngineSpec) -> None:
        import torch

        from inferq.worker.models.device import resolve_dtype
        from inferq.worker.models.lm import CausalLM

        self.conn = conn
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._done = False
        if spec.torch_threads > 0:
            torch.set_num_threads(spec.torch_threads)
        started = time.monotonic()
        device = torch.device(spec.device)
        lm = CausalLM(spec.path, device=device, dtype=resolve_dtype(spec.dtype, device),
                      model_id=spec.model_id)
        # After the weights: on CUDA the KV cache takes a share of the memory they left free.
        budget = spec.settings.budget(lm)
        self.load_s = time.monotonic() - started
        log.info("loaded model %s (weights) on %s in %.1f s; %s", spec.model_id, lm.device,
                 self.load_s, describe_budget(budget, lm.kv))
        self.engine = Engine(lm, budget)
        self.steps = StepLoop(
            self.engine, is_lost=lambda request_id: False,
            on_step=self._wake.set, on_error=self._error, on_cancelled=self._cancelled,
            on_capacity=self._capacity, on_oom=lambda n: self._emit(("oom", n)))

    def send(self, message: Any) -> None:
        data = _pack(message)
        with self._send_lock:
            self.conn.send_bytes(data)

    def _state(self) -> list[int]:
        return [self.steps.running, self.steps.due, self.engine.budget.max_slots,
                *self._device_memory()]

    def _device_memory(self) -> tuple[int, int]:
        """(allocated, reserved) bytes of CUDA memory in this process (0, 0 on the CPU): the
        worker's ``inferq_device_memory_bytes`` gauges, which it cannot read itself."""
        if self.engine.lm.torch_device.type != "cuda":
            return 0, 0
        import torch

        return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())

    def _flush(self, *, arm: bool) -> bool:
        """(Holding the send lock.) Send the step outputs not sent yet, in one message."""
        outs = self.steps.take_outputs(arm=arm)
        if not outs:
            return False
        steps = [[out.at, out.elapsed_s, [g.id for g in out.entered], out.prefill_tokens,
                  [[g.id, token, text] for g, token, text in out.advanced],
                  [[g.id, (g.finish or FinishReason.LENGTH).value, g.detok.text]
                   for g in out.finished]] for out in outs]
        self.conn.send_bytes(_pack(("steps", steps, self._state())))
        return True

    def _emit(self, message: Any) -> None:
        """An event, after the step outputs before it (in order)."""
        with self._send_lock:
            self._flush(arm=False)
            self.conn.send_bytes(_pack(message))

    def _error(self, exc: Exception, victims: list[Generation]) -> None:
        failure = failure_of(exc)
        self._emit(("error", failure.error.code, failure.error.message, failure.retryable,
                    [g.id for g in victims]))

    def _cancelled(self, gone: list[Generation]) -> None:
        lags = self.steps.cancel_lags
        self._emit(("cancelled", [g.id for g in gone], lags[-1] if lags else 0))

    def _capacity(self) -> None:
        self._emit(("capacity", *self._state()))

    def sender(self) -> None:
        while not self._done:
            with self._send_lock:
                sent = self._flush(arm=True)
            if not sent:
                self._wake.wait()
                self._wake.clear()

    def serve(self) -> None:
        self.steps.start()
        self._sender = threading.Thread(target=self.sender, name="inferq-engine-sender",
                                        daemon=True)
        self._sender.start()
        budget = self.engine.budget
        self.send(("ready", [budget.max_slots, budget.kv_tokens, budget.max_prefill_tokens],
                   self.load_s))
        while True:
            message = _unpack(self.conn.recv_bytes())
            kind = message[0]
            if kind == "submit":
                self.steps.submit([self._generation(*spec) for spec in message[1]])
            elif kind == "cancel":
                self.steps.cancel(message[1])
            elif kind == "withdraw":
                taken = self.steps.take_waiting(partial(_named, set(message[2])))
                self._emit(("withdrawn", message[1], [g.id for g in taken]))
            elif kind == "stop":
                # Drained on a thread of its own: cancellations still arrive meanwhile.
                threading.Thread(target=self._drain, name="inferq-engine-drain",
                                 daemon=True).start()

    def _drain(self) -> None:
        self.steps.stop()
        self.steps.join()
        self._done = True
        self._wake.set()
        self._sender.join()
        left = self.steps.take_waiting()
        with self._send_lock:
            self._flush(arm=False)
            self.conn.send_bytes(_pack(("stopped", [g.id for g in left])))
        os._exit(0)

    def _generation(self, request_id: str, prompt_ids: list[int], params: dict[str, Any],
                    priority: int, order: int, alone: bool, streamed: list[int],
                    shown: str) -> Generation:
        return self.engine.new_generation(
            request_id, prompt_ids, GenerationParams(**params), priority=priority,
            order=order, alone=alone, streamed=streamed, shown=shown)


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
