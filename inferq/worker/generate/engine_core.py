"""The engine process itself (the child side; ``engine_client.EngineProcess`` is the worker's
side): the model, its KV cache and the step loop (``StepLoop`` over ``Engine``: scheduler,
admission, sampling, detokenization, stop strings), fed from the pipe in ``wire``'s messages.

One thread sends: the sender. The step loop's events (a cancellation applied, capacity, a
failed step) and the replies of the pipe reader are queued in the outbox behind the step outputs
that came before them, and the sender writes them in that order, merging every step output that
queued meanwhile into one ``Steps`` message: a busy worker costs the model nothing but a pipe
write per message, and the step thread never waits for the pipe. The sender is the only consumer
of the step loop's outputs that arms it (asks to be woken by the next output); whatever takes
outputs otherwise wakes the sender, which takes and arms again, so no output waits for a later
event to leave.

The engine ignores SIGINT/SIGTERM (the worker decides when it drains) and exits when the
worker's end of the pipe closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
            self.engine = Engine(lm, spec.settings.budget(lm))
        budget = self.engine.budget
        self.load_s = time.monotonic() - started
        log.info("loaded model %s (weights) on %s in %.1f s (%s engine); %s", spec.model_id,
                 lm.device, self.load_s, spec.engine, describe_budget(budget, lm.kv))
        self.steps = StepLoop(self.engine, self, max_preemptions=spec.settings.max_preemptions,
                              swap_bytes=swap_bytes)
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
        return wire.EngineState(running=self.steps.running_count, due=self.steps.due,
                                max_slots=self.engine.slots_now(), step=self.engine.steps,
                                device_allocated=allocated, device_reserved=reserved,
                                kv_usage=kv_usage, engine_preemptions=preemptions)

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
            trace_headers=spec.trace_headers)
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
