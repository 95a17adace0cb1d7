"""The ``generate`` worker: iteration-level batching over the Redis queue, with token streams.

The model runs on its own thread (``steploop.StepLoop``): decode steps back to back, each one
admitting waiting requests in priority order under the slot and KV-token budgets and letting
finished and cancelled ones leave. One asyncio loop owns the Redis I/O, concurrently:

* the claimer claims from Redis as many requests as there will be free slots at the next step
  boundary (free slots, plus sequences finishing by length in the step in flight), while the
  step runs (one Lua call; decoding, validation, chat-template rendering and tokenization on a
  helper thread), so new requests join the running batch at the next step instead of waiting
  for it to drain. It claims only what it can admit: the backlog stays in Redis, in priority
  order, where any worker can take it, and a high-priority arrival is claimed first;
* the publisher appends each step's new text to every running request's Redis Stream and
  writes the results of finished ones: one pipelined round trip per step (``stream``, token
  checked; ``complete``; ``stream_end``), falling behind gracefully (queued steps are merged
  into one write). The ``stream`` call reports requests whose lease is gone: cancelled by their
  producer (``Handle.cancel``) or taken over. Nothing is appended for them after that and the
  model thread drops them at its next step boundary, freeing the slot.

Leases of everything claimed are extended by the heartbeat thread (``LeaseBook``). On
SIGTERM/SIGINT the worker stops claiming, gives waiting claims back at once, and finishes the
generations in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from inferq import connection
from inferq.errors import ConfigError, DeadlineExceeded, InferqError, InvalidInput
from inferq.protocol import ops
from inferq.protocol.codec import (
    ErrorInfo,
    RequestPayload,
    Result,
    Status,
    Usage,
    encode_result,
)
from inferq.protocol.generation import FinishReason, parse_generation_params
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.worker.backoff import RedisBackoff
from inferq.worker.batch import ResultContext, decode_claims, failed_completion
from inferq.worker.config import WorkerConfig
from inferq.worker.generation.engine import Engine, Generation
from inferq.worker.generation.lm import CausalLM
from inferq.worker.generation.scheduler import Budget
from inferq.worker.generation.steploop import StepLoop, StepOutput
from inferq.worker.isolation import failure_of
from inferq.worker.leases import Heartbeat, LeaseBook
from inferq.worker.metrics import HealthState, WorkerMetrics
from inferq.worker.metrics import serve as serve_metrics
from inferq.worker.queue_link import QueueLink
from inferq.worker.wake import WakeWaiter, wait_any

log = logging.getLogger("inferq.worker")

PUBLISHER_SCRIPTS = ("stream", "complete", "stream_end")
#: KV cache budget on a CPU when none is given. Never derived from the host's RAM: a worker
#: shares its machine, and a cache sized from all of it would starve everything else.
CPU_KV_CACHE_MB = 1024
#: Share of the free device memory (after loading the model) the KV cache may take on CUDA.
CUDA_KV_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """How a ``generate`` worker batches (``inferq worker --task generate``)."""

    #: Sequences decoded together in one step.
    max_slots: int = 16
    #: KV cache budget in MiB; None sizes it for the device (CUDA: half the free memory after
    #: loading; CPU: ``CPU_KV_CACHE_MB``).
    kv_cache_mb: float | None = None
    #: Prompt tokens prefilled in one step (the first admission of a step always runs).
    max_prefill_tokens: int = 2048
    #: Stream writes (and result writes) happen at most this often; the steps in between
    #: are merged into one write. Adds up to this much to TTFT (cancellations do not wait for
    #: it: they are pushed to the worker). Each write costs the event loop GIL time the model
    #: thread waits for: on the 2-core CPU, 25 ms gave the tiny model ~20% more tokens/s than
    #: 10 ms (medians over 3 interleaved rounds of 2 burst runs; single runs vary by as much).
    stream_interval_ms: float = 25.0

    def __post_init__(self) -> None:
        if self.max_slots < 1:
            raise ConfigError(f"max_slots must be >= 1, got {self.max_slots}")
        if self.kv_cache_mb is not None and not self.kv_cache_mb > 0:
            raise ConfigError(f"kv_cache_mb must be > 0, got {self.kv_cache_mb}")
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise ConfigError(
                f"stream_interval_ms must be in [0, 1000], got {self.stream_interval_ms}")

    def budget(self, lm: CausalLM) -> Budget:
        if self.kv_cache_mb is not None:
            cache_bytes = int(self.kv_cache_mb * 2**20)
        elif lm.torch_device.type == "cuda":
            import torch

            free, _total = torch.cuda.mem_get_info(lm.torch_device)
            cache_bytes = int(free * CUDA_KV_FRACTION)
        else:
            cache_bytes = CPU_KV_CACHE_MB * 2**20
        return Budget(max_slots=self.max_slots,
                      kv_tokens=max(1, cache_bytes // lm.kv.bytes_per_token),
                      max_prefill_tokens=self.max_prefill_tokens)


@dataclass(slots=True)
class Claim:
    """What the worker knows of a claimed generation besides the engine's state."""

    claimed: ops.Claimed
    payload: RequestPayload
    #: Enqueue time and deadline on this worker's monotonic clock.
    arrival: float
    deadline: float | None
    claimed_ms: int
    first_visible: float | None = None


@dataclass
class GenerationStats:
    steps: int = 0
    requests: int = 0
    tokens: int = 0
    prefill_tokens: int = 0
    #: Steps that admitted (prefilled) sequences besides decoding the running ones.
    admission_steps: int = 0
    failed: int = 0
    refused: int = 0
    released: int = 0
    retried: int = 0
    cancelled: int = 0
    oom_splits: int = 0
    forward_s: float = 0.0
    batch_sum: int = 0
    max_batch: int = 0
    finish: dict[str, int] = field(default_factory=dict)

    def as_fields(self, running: int, waiting: int) -> dict[str, str]:
        import json

        mean = self.batch_sum / self.steps if self.steps else 0.0
        return {
            "mode": "continuous",
            "batches": str(self.steps),
            "steps": str(self.steps),
            "requests": str(self.requests),
            "tokens": str(self.tokens),
            "prefill_tokens": str(self.prefill_tokens),
            "admission_steps": str(self.admission_steps),
            "failed": str(self.failed),
            "refused": str(self.refused),
            "retried": str(self.retried),
            "cancelled": str(self.cancelled),
            "oom_splits": str(self.oom_splits),
            "mean_batch_size": f"{mean:.3f}",
            "max_batch_size": str(self.max_batch),
            "padding_efficiency": "1.0000",
            "forward_s": f"{self.forward_s:.4f}",
            "window_ms": "0",
            "target_batch_size": str(running),
            "running": str(running),
            "waiting": str(waiting),
            "reasons": json.dumps(self.finish),
            "sizes": json.dumps({}),
        }


class GenerationWorker:
    def __init__(self, config: WorkerConfig, lm: CausalLM,
                 settings: GenerationSettings | None = None, *,
                 clock: Any = time.monotonic) -> None:
        self.config = config
        self.lm = lm
        self.settings = settings or GenerationSettings()
        self.clock = clock
        self.budget = self.settings.budget(lm)
        self.engine = Engine(lm, self.budget, clock=clock)
        self.keys = QueueKeys.for_model(config.task, config.model_name, config.namespace)
        self.book = LeaseBook()
        self.stats = GenerationStats()
        self.metrics = WorkerMetrics(self.keys.queue, config.worker_id)
        self.health = HealthState(stale_after_s=max(10.0, config.lease_ms / 1e3))
        self.link = QueueLink(config, self.keys, self.book, self.metrics, clock)
        self.metrics_server: ThreadingHTTPServer | None = None
        self.ctx = ResultContext(worker=config.worker_id, task=config.task,
                                 model=config.model_name, limits=config.limits,
                                 retry_base_ms=config.retry_base_ms,
                                 retry_max_ms=config.retry_max_ms)
        self._order = itertools.count()
        self._maybe_pending = True
        self._wakes = 0
        self._retry_at: float | None = None
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-prepare")
        self._stopping: asyncio.Event | None = None
        log.info("generation budget: %d slots, %d KV tokens (%.0f MiB), %d prefill tokens/step",
                 self.budget.max_slots, self.budget.kv_tokens,
                 self.budget.kv_tokens * lm.kv.bytes_per_token / 2**20,
                 self.budget.max_prefill_tokens)

    # ----------------------------------------------------------------------------- lifecycle

    def request_stop(self) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            log.info("stopping: no new claims; finishing the generations in hand")
            self._stopping.set()

    @property
    def running(self) -> list[Generation]:
        return self.engine.running

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        self._nudge = asyncio.Event()
        self._publish_wake = asyncio.Event()
        self._publish_stop = False
        self._failures: list[list[ops.Completion]] = []
        self.redis = connection.async_client(self.config.connection)
        self._blocking = connection.async_client(self.config.connection)
        self._publisher_redis = connection.async_client(self.config.connection)
        self.link.attach(self.redis, ops.register(self.redis))
        self._publisher_scripts = ops.register(self._publisher_redis)
        # Cancellations first: BLPOP serves its lists in order, and the wake list of a busy
        # queue is never empty.
        self._cancels_key = self.keys.cancels(self.config.worker_id)
        self._wake = WakeWaiter(self._blocking, self._cancels_key, self.keys.wake)
        self.steps = StepLoop(
            self.engine, is_lost=self.book.is_lost, clock=self.clock,
            on_step=lambda: loop.call_soon_threadsafe(self._publish_wake.set),
            on_error=lambda exc, victims: loop.call_soon_threadsafe(
                self._on_step_failed, exc, victims),
            on_cancelled=lambda gone: loop.call_soon_threadsafe(self._on_cancelled, gone),
            on_capacity=lambda: loop.call_soon_threadsafe(self._nudge.set),
            on_oom=lambda sequences: loop.call_soon_threadsafe(self._on_oom, sequences))
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(self.metrics, self.health,
                                                self.config.metrics_port)
            log.info("metrics and /healthz on port %d", self.metrics_server.server_address[1])
        await self.link.check_server()
        for name in PUBLISHER_SCRIPTS:  # the publisher's plain EVALSHA needs them loaded
            await self._publisher_redis.script_load(self._publisher_scripts[name].script)
        await self.redis.sadd(queues_registry(self.config.namespace), self.keys.queue)
        heartbeat = Heartbeat(self.config.connection, self.keys, self.config.worker_id,
                              self.book, lease_ms=self.config.lease_ms,
                              interval_s=self.config.heartbeat_s)
        heartbeat.beat()
        heartbeat.start()
        await self.link.reclaim()
        log.info("worker %s serving %s with continuous batching (device %s)",
                 self.config.worker_id, self.keys.queue, self.lm.device)
        self.steps.start()
        background = [asyncio.create_task(self.link.maintain(
                          self.health, self.lm.device, upkeep=self._upkeep,
                          detail=lambda: {"steps": self.stats.steps,
                                          "running": self.steps.running})),
                      asyncio.create_task(self._wake_loop())]
        publisher = asyncio.create_task(self._publish_loop())
        try:
            await self._claim_loop()
        finally:
            await self._release(self.steps.take_waiting(_unstarted))
            self.steps.stop()
            await asyncio.to_thread(self.steps.join)
            await self._release(self.steps.take_waiting())
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.sleep(0)  # callbacks the model thread scheduled last
            self._publish_stop = True
            self._publish_wake.set()
            with contextlib.suppress(Exception):
                await publisher
            heartbeat.stop()
            with contextlib.suppress(RedisError):
                await self._publish_stats()
            await self._wake.close()
            for client in (self._blocking, self._publisher_redis, self.redis):
                await client.aclose()
            self._prepare_pool.shutdown(wait=True)
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            log.info("worker %s stopped after %d steps (%d admitting), %d requests, %d tokens",
                     self.config.worker_id, self.stats.steps, self.stats.admission_steps,
                     self.stats.requests, self.stats.tokens)

    # ---------------------------------------------------------------------------- claiming

    async def _claim_loop(self) -> None:
        """Claim whenever slots will be free at the next step boundary and work may be
        pending; sleep on a nudge (capacity freed, wake token, due retry) otherwise."""
        assert self._stopping is not None
        backoff = RedisBackoff("generation claims")
        while not self._stopping.is_set():
            self._nudge.clear()
            await self._expire_waiting()
            free = self.steps.capacity()
            if free > 0 and self._maybe_pending:
                try:
                    await self._claim(free)
                    backoff.succeeded()
                except RedisError as exc:
                    await backoff.failed(exc, self._stopping)
                continue
            timeout = None if self._retry_at is None else max(0.0, self._retry_at - self.clock())
            await wait_any((self._nudge, self._stopping), timeout)
            if self._retry_at is not None and self.clock() >= self._retry_at:
                self._retry_at = None
                self._maybe_pending = True

    async def _wake_loop(self) -> None:
        """Block on this worker's cancel list and the queue's wake list (enqueue pushes a token
        per request): a cancelled generation leaves the batch at the next decode step; a wake
        token says work may be pending."""
        assert self._stopping is not None
        backoff = RedisBackoff("wake")
        while True:
            try:
                woke = await self._wake.wait(None, also=self._stopping)
                backoff.succeeded()
            except RedisError as exc:
                await backoff.failed(exc)
                continue
            if self._stopping.is_set():
                return
            if woke is not None and woke[0] == self._cancels_key:
                self.steps.cancel([woke[1]])
            elif woke is not None:
                self._wakes += 1
                self._maybe_pending = True
                self._nudge.set()

    async def _claim(self, free: int) -> None:
        wakes = self._wakes
        reply = await self.link.claim(free)
        self._retry_at = (None if reply.next_retry_ms is None
                          else self.clock() + max(reply.next_retry_ms / 1e3, 0.001))
        if len(reply.claimed) < free and wakes == self._wakes:
            # Pending is empty; the wake list says when it is not (a token that arrived while
            # this claim was in flight keeps the flag set).
            self._maybe_pending = False
        if not reply.claimed:
            return
        loop = asyncio.get_running_loop()
        generations, failures = await loop.run_in_executor(
            self._prepare_pool, self._prepare, reply.claimed, reply.now_ms)
        self.steps.submit(generations)
        if failures:
            await self._complete(failures)

    def _prepare(self, claimed: Sequence[ops.Claimed],
                 now_ms: int) -> tuple[list[Generation], list[ops.Completion]]:
        """Decode, validate, render and tokenize (helper thread). Bad requests fail here."""
        valid, failures = decode_claims(self.ctx, claimed, now_ms)
        offset = now_ms / 1e3 - self.clock()
        encoded = self.lm.encode([p for _, p in valid]) if valid else []
        generations: list[Generation] = []
        for (c, payload), ids in zip(valid, encoded, strict=True):
            try:
                if isinstance(ids, InferqError):
                    raise ids
                params = parse_generation_params(payload.params)
                if len(ids) >= self.lm.max_positions:
                    raise InvalidInput(f"the prompt has {len(ids)} tokens; the model's context "
                                       f"is {self.lm.max_positions}")
                claim = Claim(claimed=c, payload=payload, arrival=c.enqueued_ms / 1e3 - offset,
                              deadline=None if c.deadline_ms is None
                              else c.deadline_ms / 1e3 - offset, claimed_ms=now_ms)
                g = self.engine.new_generation(c.id, ids, params, priority=payload.priority,
                                               order=next(self._order), tag=claim)
                if not self.engine.fits_alone(g):
                    raise InvalidInput(
                        f"prompt ({len(ids)} tokens) + max_new_tokens ({g.max_new}) exceed "
                        f"this worker's KV cache budget of {self.budget.kv_tokens} tokens")
            except InferqError as exc:
                failures.append(failed_completion(self.ctx, c, exc, now_ms))
                continue
            generations.append(g)
        return generations, failures

    async def _expire_waiting(self) -> None:
        now = self.clock()
        overdue = self.steps.take_waiting(
            lambda g: (d := _claim(g).deadline) is not None and d <= now)
        if not overdue:
            return
        now_ms = self.link.to_ms(now)
        error = DeadlineExceeded("the deadline passed before the request could run")
        await self._complete([failed_completion(self.ctx, _claim(g).claimed, error, now_ms,
                                                Status.EXPIRED) for g in overdue])

    # ------------------------------------------------------ callbacks from the model thread

    def _record(self, out: StepOutput) -> None:
        size = len(out.advanced)
        self.stats.steps += 1
        self.stats.tokens += size
        self.stats.prefill_tokens += out.prefill_tokens
        self.stats.admission_steps += out.admitted > 0
        self.stats.forward_s += out.elapsed_s
        self.stats.batch_sum += size
        self.stats.max_batch = max(self.stats.max_batch, size)
        m, q = self.metrics, self.keys.queue
        m.batch_size.labels(q).observe(size)
        m.batch_fill.labels(q).observe(size / self.budget.max_slots)
        m.forward.labels(q).observe(out.elapsed_s)
        m.tokens.labels(q).inc(size + out.prefill_tokens)
        m.generated_tokens.labels(q).inc(size)

    def _on_oom(self, sequences: int) -> None:
        self.stats.oom_splits += 1
        self.metrics.oom_splits.labels(self.keys.queue).inc()
        log.warning("out of device memory with %d sequences: shrinking the batch and "
                    "re-admitting them", sequences)

    def _on_cancelled(self, gone: list[Generation]) -> None:
        for g in gone:
            self.book.drop(g.id)
            self.stats.cancelled += 1
            log.info("request %s left the batch after %d tokens: cancelled or lease lost",
                     g.id, len(g.tokens))
        self._nudge.set()

    def _on_step_failed(self, exc: Exception, victims: list[Generation]) -> None:
        """A forward raised: every sequence of the step fails (retried with backoff while
        attempts remain, as a crashed batch in the embedding worker)."""
        log.warning("generation step failed for %d requests: %s: %s", len(victims),
                    type(exc).__name__, exc)
        failure = failure_of(exc)
        now_ms = self.link.now_ms()
        completions = []
        for g in victims:
            claim = _claim(g)
            c = claim.claimed
            if failure.retryable and c.attempt < claim.payload.max_attempts:
                completions.append(ops.Completion(c.id, c.token, "retry", b"",
                                                  self.ctx.retry_delay_ms(c.attempt)))
                continue
            status = Status.DEAD if failure.retryable else Status.FAILED
            result = Result(id=c.id, status=status, error=failure.error, task=self.ctx.task,
                            model=self.ctx.model, worker=self.ctx.worker, attempts=c.attempt,
                            enqueued_ms=c.enqueued_ms, started_ms=claim.claimed_ms,
                            finished_ms=now_ms)
            completions.append(ops.Completion(c.id, c.token, status.value,
                                              encode_result(result, self.ctx.limits)))
        self._failures.append(completions)
        self._publish_wake.set()
        self._nudge.set()

    # ----------------------------------------------------------------------------- publishing

    async def _publish_loop(self) -> None:
        """Write the steps' text and results in step order (one coroutine: ordered), at most
        once per ``stream_interval_ms``: the steps that finish meanwhile are merged into one
        write (a tiny model steps every couple of ms; a write per step would cost more CPU,
        shared with the model thread, than the step itself)."""
        interval = self.settings.stream_interval_ms / 1e3
        last = -interval
        while True:
            self._publish_wake.clear()
            outs = self.steps.take_outputs(arm=True)
            failures, self._failures = self._failures, []
            if not outs and not failures:
                if self._publish_stop:
                    return
                await self._publish_wake.wait()
                continue
            wait = last + interval - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
                outs += self.steps.take_outputs(arm=False)
            last = self.clock()
            for completions in failures:
                await self._complete(completions, publisher=True)
            if outs:
                await self._publish(outs)
                for out in outs:
                    self._record(out)

    async def _publish(self, outs: list[StepOutput]) -> None:
        merged: dict[str, tuple[Generation, str]] = {}
        for out in outs:
            for g, text in out.advanced:
                prev = merged.get(g.id)
                merged[g.id] = (g, text if prev is None else prev[1] + text)
        finished = [g for out in outs for g in out.finished]
        deltas = [ops.StreamDelta(g.id, _claim(g).claimed.token, _claim(g).claimed.attempt,
                                  text) for g, text in merged.values()]
        completions = [self._completion(g) for g in finished]
        calls = [("stream", ops.stream_call(self.keys, self.config.result_ttl_ms, deltas))]
        if completions:
            calls.append(("complete", ops.complete_call(
                self.keys, self.config.result_ttl_ms, self.config.dead_letter_cap, completions)))
            calls.append(("stream_end", ops.stream_end_call(
                self.keys, self.config.result_ttl_ms, [c.id for c in completions])))
        replies = await self.link.until_leases_expire(
            lambda: self._pipelined(calls), what="publish",
            request_ids=[c.id for c in completions])
        if replies is None:
            return
        lost = set(ops.parse_ids(replies[0]))
        now = self.clock()
        for g, text in merged.values():
            claim = _claim(g)
            if text and g.id not in lost and claim.first_visible is None:
                claim.first_visible = now
        running_lost = [i for i in lost if i not in {c.id for c in completions}]
        if running_lost:
            self.steps.cancel(running_lost)
        if completions:
            written = ops.parse_complete(replies[1])
            self._account(completions, written, lost)
            for g, ok in zip(finished, written, strict=True):
                if ok:
                    self._observe_latency(g)

    def _observe_latency(self, g: Generation) -> None:
        claim, m, q = _claim(g), self.metrics, self.keys.queue
        priority = str(claim.payload.priority)
        c = claim.claimed
        m.queue_wait.labels(q, priority).observe(max(claim.claimed_ms - c.enqueued_ms, 0) / 1e3)
        m.claim_to_result.labels(q, priority).observe(max(self.link.now_ms() - claim.claimed_ms,
                                                          0) / 1e3)
        if claim.first_visible is not None:
            m.ttft.labels(q, priority).observe(max(claim.first_visible - claim.arrival, 0.0))

    async def _pipelined(self, calls: Sequence[tuple[str, ops.Call]]) -> list[Any]:
        """Several scripts in one round trip, in order, as plain EVALSHA (redis-py's pipelined
        script objects would first send SCRIPT EXISTS: a second round trip at every step). A
        server that lost its script cache (restart, SCRIPT FLUSH) gets all of them loaded
        again, and only the calls it refused run again, so nothing is written twice."""
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = self._publisher_redis.pipeline(transaction=False)
            for i in todo:
                name, (keys, args) = calls[i]
                pipe.evalsha(self._publisher_scripts[name].sha, len(keys), *keys, *args)
            results = await pipe.execute(raise_on_error=False)
            missing = []
            for i, result in zip(todo, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 1:
                    missing.append(i)
                elif isinstance(result, Exception):
                    raise result
                else:
                    replies[i] = result
            if not missing:
                return replies
            for name in PUBLISHER_SCRIPTS:
                script = self._publisher_scripts[name]
                script.sha = await self._publisher_redis.script_load(script.script)
            todo = missing
        raise AssertionError("unreachable")

    def _completion(self, g: Generation) -> ops.Completion:
        claim = _claim(g)
        c = claim.claimed
        finished_at = g.finished_at if g.finished_at is not None else self.clock()
        # A text that became visible in this very write is visible when the write returns;
        # "now" is within that round trip.
        first = claim.first_visible if claim.first_visible is not None else self.clock()
        finish = g.finish or FinishReason.LENGTH
        output: dict[str, Any] = {"text": g.detok.text, "token_ids": g.tokens}
        common: dict[str, Any] = dict(
            id=c.id, task=self.ctx.task, model=self.ctx.model, worker=self.ctx.worker,
            attempts=c.attempt, batch_size=round(g.batch_sum / max(g.steps, 1)),
            input_tokens=g.prompt_tokens, enqueued_ms=c.enqueued_ms,
            started_ms=claim.claimed_ms, finished_ms=self.link.to_ms(finished_at),
            compute_ms=round((finished_at - (g.admitted_at or finished_at)) * 1e3, 3),
            finish_reason=finish,
            usage=Usage(prompt_tokens=g.prompt_tokens, completion_tokens=len(g.tokens)),
            ttft_ms=round(max(0.0, first - claim.arrival) * 1e3, 3),
        )
        self.stats.finish[finish.value] = self.stats.finish.get(finish.value, 0) + 1
        try:
            body = encode_result(Result(status=Status.OK, output=output, **common),
                                 self.ctx.limits)
            status = Status.OK
        except InferqError as exc:
            body = encode_result(Result(status=Status.FAILED,
                                        error=ErrorInfo(code=exc.code, message=exc.message),
                                        **common), self.ctx.limits)
            status = Status.FAILED
        return ops.Completion(c.id, c.token, status.value, body)

    def _account(self, completions: Sequence[ops.Completion], written: Sequence[bool],
                 cancelled: Collection[str] = ()) -> None:
        for completion, ok in zip(completions, written, strict=True):
            self.book.drop(completion.id)
            if not ok:
                if completion.id in cancelled:
                    self.stats.cancelled += 1
                    continue
                self.metrics.observe_outcome(completion.status, ok)
                self.stats.refused += 1
                log.warning("completion of %s refused: lease lost or request cancelled",
                            completion.id)
                continue
            self.metrics.observe_outcome(completion.status, ok)
            if completion.status == "retry":
                self.stats.retried += 1
            elif completion.status == "ok":
                self.stats.requests += 1
            else:
                self.stats.failed += 1

    async def _complete(self, completions: Sequence[ops.Completion], *,
                        publisher: bool = False) -> None:
        if not completions:
            return
        written = await self.link.complete(
            completions, scripts=self._publisher_scripts if publisher else None)
        if written is not None:
            self._account(completions, written)

    async def _release(self, generations: Sequence[Generation]) -> None:
        self.stats.released += await self.link.release(
            [(g.id, _claim(g).claimed.token) for g in generations])

    # ---------------------------------------------------------------------------- upkeep

    async def _upkeep(self, reclaimed: tuple[int, int]) -> None:
        if reclaimed[0]:
            self._maybe_pending = True
            self._nudge.set()
        await self._publish_stats()

    async def _publish_stats(self) -> None:
        fields = self.stats.as_fields(self.steps.running, self.steps.waiting)
        fields.update({"model": self.lm.model_id, "device": self.lm.device,
                       "max_slots": str(self.budget.max_slots),
                       "kv_tokens": str(self.budget.kv_tokens)})
        await self.link.publish_stats(fields)
        m, q = self.metrics, self.keys.queue
        m.running.labels(q).set(self.steps.running)
        m.target_batch.labels(q).set(self.engine.budget.max_slots)


def _unstarted(g: Generation) -> bool:
    return not g.tokens


def _claim(g: Generation) -> Claim:
    claim = g.tag
    assert isinstance(claim, Claim)
    return claim
