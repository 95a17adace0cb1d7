"""The engine process itself (the child side; ``engine_client.EngineProcess`` is the worker's
side): the model, its KV cache and the step loop (``StepLoop`` over ``Engine``: scheduler,
admission, sampling, detokenization, stop strings), fed from the pipe in ``wire``'s messages.

Its messages to the worker go through the ``Outbox``: in order (an event after the step
outputs before it), few (step outputs merged into one ``Steps`` message at most once per stream
interval; first tokens, finished sequences, replies, failures and freed slots at once), and
written by whichever thread has them while the pipe has room, by the sender thread otherwise,
so the step thread never waits for the pipe and wakes no thread per step.

The engine ignores SIGINT/SIGTERM (the worker decides when it drains) and exits when the
worker's end of the pipe closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.worker.core.failures import Failure, failure_of
from inferq.worker.generate import wire
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.settings import describe_budget
from inferq.worker.generate.steploop import StepLoop, StepOutput
from inferq.worker.generate.wire import EngineSpec

log = logging.getLogger("inferq.worker")

#: The interpreter's switch interval in the engine process (see ``child_main``).
ENGINE_SWITCH_INTERVAL_S = 0.0005


def step_record(out: StepOutput) -> wire.StepRecord:
    return wire.StepRecord(
        out.step, out.at, out.elapsed_s, [g.id for g in out.entered], out.prefill_tokens,
        [g.id for g in out.preempted],
        [wire.Advanced(g.id, token, text) for g, token, text in out.advanced],
        [wire.Finished(g.id, (g.finish or FinishReason.LENGTH).value, g.detok.text,
                       g.logprob_output) for g in out.finished])


def pipe_writable(conn: Connection) -> Callable[[], bool]:
    """Whether ``conn`` takes a write now without blocking (room in its socket buffer)."""
    fd = conn.fileno()

    def writable() -> bool:
        return bool(select.select((), (fd,), (), 0)[1])
    return writable


#: Replies and failures, and the first and last messages: written at once. Step outputs wait
#: for the outbox's gap; a ``Capacity`` waits too unless it frees slots or the engine is idle
#: (``Outbox._urgent``).
URGENT = (wire.Ready, wire.Cancelled, wire.Failed, wire.OutOfMemory, wire.Withdrawn,
          wire.Stopped)


class Outbox:
    """The engine process' messages to the worker, in order, and few of them.

    Every message costs the step thread more than its system call: waking another thread or
    the worker process' reader on a busy machine hands the CPU and the GIL over and back, and
    at one message per step it cost a tiny model about a tenth of its steps. So step outputs
    are merged into one ``Steps`` message at most once per ``gap_s`` (the worker writes streams
    at most once per stream interval anyway), and so is a ``Capacity`` that frees no slot; a
    step that admitted or finished sequences (first tokens and results are not paced), a
    message that frees slots, answers the worker, ends something (``URGENT``) or leaves the
    engine idle goes at once, with every output before it. No timer ends the gap (a timer is
    a thread woken): the first output after it does, so an output waits at most the gap and
    one step. The messages keep their order: an event goes after the outputs taken before it.

    Whoever has something to send (the step thread at its output, the pipe reader replying,
    an event) writes it itself while the pipe has room and the sender thread is idle; the
    sender thread (``run``) writes only what finds the pipe full (the worker slow to read) or
    the sender busy, and the last message, so the step thread never waits for the pipe. The
    step loop's outputs are taken with ``arm``: its next output calls ``outputs_ready`` again
    (which only gathers it while the gap runs)."""

    def __init__(self, conn: Connection, steps: StepLoop,
                 state: Callable[[], wire.EngineState], *, gap_s: float = 0.0,
                 writable: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.steps = steps
        self.state = state
        self.gap_s = gap_s
        self.writable = pipe_writable(conn) if writable is None else writable
        self.clock = clock
        self._lock = threading.Lock()
        #: Messages, and the step records of one ``Steps`` message still being gathered.
        self._queue: list[wire.ToWorker | list[wire.StepRecord]] = []
        self._last_write = -gap_s
        #: The sender writes next: a full pipe, or messages queued while it was writing.
        self._handoff = False
        #: The sender is writing (outside the lock): others queue behind it.
        self._busy = False
        #: Free slots as of the last state written (a ``Capacity`` with more is urgent).
        self._free = 0
        #: A gathered step admitted or finished sequences: the next flush writes at once.
        self._firsts = False
        #: Sequences whose first text (since they entered or resumed) was gathered.
        self._texted: set[str] = set()
        self._wake = threading.Event()
        self._closed = False

    def put(self, message: wire.ToWorker) -> None:
        """Send ``message`` after the step outputs so far (any thread; never blocks on the
        pipe)."""
        with self._lock:
            self._take()
            if isinstance(message, wire.Cancelled):
                self._texted.difference_update(message.ids)
            self._queue.append(message)
            self._flush(urgent=self._urgent(message))

    def outputs_ready(self) -> None:
        """The step loop's ``outputs_ready``: gather its new outputs, and send them once the
        gap is over."""
        with self._lock:
            self._take()
            self._flush(urgent=False)

    def close(self, message: wire.ToWorker) -> None:
        """``message`` is the last one: the sender sends what is queued, then it, and returns."""
        with self._lock:
            self._take()
            self._queue.append(message)
            self._closed = True
        self._wake.set()

    def _urgent(self, message: wire.ToWorker) -> bool:
        if isinstance(message, wire.Capacity):
            return message.state.running == 0 or _free(message.state) > self._free
        return isinstance(message, URGENT)

    def _take(self) -> None:
        """(Holding the lock.) Gather the step outputs so far into the ``Steps`` message being
        gathered, and arm the step loop for the next one (a take that finds outputs disarms
        it)."""
        records: list[wire.StepRecord] = []
        while more := self.steps.take_outputs(arm=True):
            records += [step_record(out) for out in more]
        if not records:
            return
        self._firsts = self._firsts or any(r.admitted or r.finished for r in records)
        for r in records:
            # A sequence's first text (since it entered or resumed) leaves at once too: the
            # time to first token is what a stream's caller waits for.
            for a in r.advanced:
                if a.text and a.id not in self._texted:
                    self._texted.add(a.id)
                    self._firsts = True
            self._texted.difference_update(r.preempted)
            self._texted.difference_update(f.id for f in r.finished)
        if self._queue and isinstance(last := self._queue[-1], list):
            last += records
        else:
            self._queue.append(records)

    def _flush(self, *, urgent: bool) -> None:
        """(Holding the lock.) Write the queue here if it is time, the pipe has room and the
        sender is idle; else leave it to the first output after the gap, or to the sender."""
        if not self._queue or self._closed:
            return
        if not (urgent or self._firsts) and self.clock() < self._last_write + self.gap_s:
            return  # the first output after the gap takes it along
        if self._busy or not self.writable():
            self._handoff = True
            self._wake.set()
            return
        batch, self._queue = self._queue, []
        self._firsts = False
        try:
            self._write(batch)
        except (OSError, ValueError):
            # The worker is gone: its pipe's end closed. The pipe reader sees it too, and the
            # process exits; nothing is sent after this.
            self._closed = True

    def _write(self, batch: list[wire.ToWorker | list[wire.StepRecord]]) -> None:
        for item in batch:
            if isinstance(item, list):
                state = self.state()
                self._free = _free(state)
                item = wire.Steps(item, state)
            elif isinstance(item, wire.Capacity):
                self._free = _free(item.state)
            self.conn.send_bytes(wire.encode(item))
        self._last_write = self.clock()

    def run(self) -> None:
        """The sender: writes what could not be written at once, and the last message."""
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                last = self._closed
                if not (last or self._handoff):
                    continue
                self._take()
                batch, self._queue = self._queue, []
                self._handoff, self._busy, self._firsts = False, True, False
            try:
                self._write(batch)
            finally:
                with self._lock:
                    self._busy = False
            if last:
                return


def _free(state: wire.EngineState) -> int:
    """Slots free after the step in flight, as ``state`` tells."""
    return state.max_slots - state.running + state.due


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
        #: The prefix cache's version last sent (``EngineState.held``, only when it changed).
        self._held_sent = -1
        # Step outputs leave at most once per stream interval: the worker writes streams no
        # more often (``Outbox``).
        self.outbox = Outbox(conn, self.steps, self._state,
                             gap_s=spec.settings.stream_interval_ms / 1e3)
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
        # Their slots are free now: the worker counts them at once, not at the next step.
        self.outbox.put(wire.Capacity(self._state()))

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
