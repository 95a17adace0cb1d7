"""The worker loop.

One asyncio loop owns all Redis I/O. Two coroutines share it:

* the collector claims windows of requests (one Lua call each), decodes and tokenizes them on a
  helper thread, and decides with the adaptive ``WindowPolicy`` when to release a batch. While
  the model is busy it keeps claiming and tokenizing the next window (waiting is free then);
* the executor runs each batch's forward pass on the model thread (torch releases the GIL) and
  writes all results with one ``complete`` call per batch, overlapped with the next forward.

Leases are extended by a heartbeat thread with its own connection. Expired leases of any
worker are reclaimed by a periodic sweep. On SIGTERM/SIGINT the worker stops claiming,
finishes the batch in hand, and gives unstarted claims back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any

from redis.exceptions import RedisError

from inferq import connection
from inferq.errors import DeadlineExceeded, InferqError, InvalidInput
from inferq.protocol import ops, scores
from inferq.protocol.codec import RequestPayload, Status
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.worker.backoff import RedisBackoff
from inferq.worker.batch import (
    Batch,
    Job,
    ResultContext,
    decode_claims,
    failed_completion,
    job_result,
)
from inferq.worker.config import WorkerConfig
from inferq.worker.isolation import Failure, run_isolated
from inferq.worker.leases import Heartbeat, LeaseBook
from inferq.worker.memory import MemoryGovernor, free_device_cache
from inferq.worker.metrics import HealthState, WorkerMetrics
from inferq.worker.metrics import serve as serve_metrics
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.packing import fill_tokens, pack
from inferq.worker.policy import ReleaseReason, WindowConfig, WindowPolicy
from inferq.worker.queue_link import QueueLink
from inferq.worker.telemetry import WorkerStats
from inferq.worker.tuning import load_policy, save_policy
from inferq.worker.wake import WakeWaiter, wait_any

log = logging.getLogger("inferq.worker")



def _job_tokens(job: Job) -> int:
    return job.tokens


class Worker:
    def __init__(self, config: WorkerConfig, model: BatchModel, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.model = model
        self.clock = clock
        self.keys = QueueKeys.for_model(config.task, config.model_name, config.namespace)
        self.window_config = WindowConfig(
            max_batch_size=config.max_batch_size,
            max_batch_tokens=config.max_batch_tokens,
            max_wait_s=config.max_wait_ms / 1e3,
        )
        self.policy = WindowPolicy(self.window_config)
        self.stats = WorkerStats()
        self.book = LeaseBook()
        self.ctx = ResultContext(worker=config.worker_id, task=config.task,
                                 model=config.model_name, limits=config.limits,
                                 retry_base_ms=config.retry_base_ms,
                                 retry_max_ms=config.retry_max_ms)
        self._carry: list[Job] = []
        self._batch_ids = itertools.count(1)
        self._forward_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-forward")
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-prepare")
        self._completions: set[asyncio.Task[None]] = set()
        self._stopping: asyncio.Event | None = None
        self.resumed_tuning = False
        self._unpublished = False
        self._next_retry_s: float | None = None
        self.memory = MemoryGovernor(config.max_batch_tokens)
        self.metrics = WorkerMetrics(self.keys.queue, config.worker_id)
        self.health = HealthState(stale_after_s=max(10.0, config.lease_ms / 1e3))
        self.link = QueueLink(config, self.keys, self.book, self.metrics, clock)
        self.metrics_server: ThreadingHTTPServer | None = None

    # ----------------------------------------------------------------------------- lifecycle

    def request_stop(self) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            log.info("stopping: no new claims; finishing the batch in hand")
            self._stopping.set()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        self._stopping = asyncio.Event()
        self._device_idle = asyncio.Event()
        self._device_idle.set()
        self._ready: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=1)
        self.redis = connection.async_client(self.config.connection)
        self._blocking = connection.async_client(self.config.connection)
        self.link.attach(self.redis, ops.register(self.redis))
        self._wake = WakeWaiter(self._blocking, self.keys.wake)
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        await self.link.check_server()
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(self.metrics, self.health,
                                                self.config.metrics_port)
            log.info("metrics and /healthz on port %d", self.metrics_server.server_address[1])
        self.policy, self.resumed_tuning = await load_policy(
            self.redis, self.keys, self.model.model_id, self.window_config)
        await self.redis.sadd(queues_registry(self.config.namespace), self.keys.queue)
        heartbeat = Heartbeat(self.config.connection, self.keys, self.config.worker_id,
                              self.book, lease_ms=self.config.lease_ms,
                              interval_s=self.config.heartbeat_s)
        heartbeat.beat()
        heartbeat.start()
        await self.link.reclaim()
        log.info("worker %s serving %s (device %s, window max %.1f ms, batch max %d, "
                 "tuning %s)", self.config.worker_id, self.keys.queue, self.model.device,
                 self.config.max_wait_ms, self.config.max_batch_size,
                 "resumed" if self.resumed_tuning else "fresh")
        maintenance = asyncio.create_task(self.link.maintain(
            self.health, self.model.device, upkeep=lambda reclaimed: self._publish(),
            detail=lambda: {"batches": self.stats.batches}))
        try:
            await asyncio.gather(self._collect_loop(), self._execute_loop())
        finally:
            maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await maintenance
            if self._completions:
                await asyncio.gather(*self._completions, return_exceptions=True)
            await self._release(self._carry)
            self._carry = []
            heartbeat.stop()
            await self._publish()
            await self._wake.close()
            await self._blocking.aclose()
            await self.redis.aclose()
            self._forward_pool.shutdown(wait=True)
            self._prepare_pool.shutdown(wait=True)
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            log.info("worker %s stopped after %d batches, %d requests",
                     self.config.worker_id, self.stats.batches, self.stats.requests)

    # ----------------------------------------------------------------------------- collector

    async def _collect_loop(self) -> None:
        assert self._stopping is not None
        backoff = RedisBackoff("collector")
        try:
            while not self._stopping.is_set():
                try:
                    batch = await self._build_batch()
                except RedisError as exc:
                    await backoff.failed(exc, self._stopping)
                    continue
                backoff.succeeded()
                if batch is None:
                    break
                await self._ready.put(batch)
        finally:
            await self._ready.put(None)

    async def _build_batch(self) -> Batch | None:
        """Claim and wait until the policy releases a batch. Claimed jobs live in
        ``self._carry`` throughout, so a Redis error here loses none of them."""
        assert self._stopping is not None
        cfg = self.window_config
        while True:
            if self._stopping.is_set():
                return None
            jobs = self._carry = [job for job in self._carry if not self.book.is_lost(job.id)]
            if len(jobs) < cfg.max_batch_size:
                jobs += await self._claim(cfg.max_batch_size - len(jobs))
            if not jobs:
                if self._unpublished:
                    await self._publish()  # idle: make stats current before sleeping
                await self._wake.wait(self._next_retry_s, also=self._stopping)
                continue
            budget = self.memory.budget(max(job.tokens for job in jobs))
            tokens = fill_tokens(jobs, _job_tokens)
            full = len(jobs) >= cfg.max_batch_size or (budget is not None and tokens >= budget)
            if not self._device_idle.is_set():
                # The model is busy: collecting more costs no latency. Wake on new work or
                # when the device frees up.
                if full:
                    await wait_any((self._device_idle, self._stopping))
                else:
                    await self._wake.wait(None, also=self._device_idle)
                continue
            now = self.clock()
            if await self._expire_overdue(now):
                continue
            if full:
                if await self._admit_higher_priority(jobs):
                    continue  # the window changed: decide again
                reason = (ReleaseReason.FULL if len(jobs) >= cfg.max_batch_size
                          else ReleaseReason.BUDGET)
                return self._release_batch(jobs, budget, reason)
            decision = self.policy.decide(
                now, size=len(jobs), tokens=tokens,
                oldest_arrival=min(job.arrival for job in jobs),
                earliest_deadline=min((j.deadline for j in jobs if j.deadline is not None),
                                      default=None),
            )
            if decision.release:
                return self._release_batch(jobs, budget, decision.reason)
            await self._wake.wait(decision.wait_s, also=self._stopping)

    async def _admit_higher_priority(self, jobs: list[Job]) -> bool:
        """Priority over a pre-claimed window: the window was filled while the model was busy;
        if a request of higher priority than the window's lowest arrived since, swap it in and
        give the displaced requests back to ``pending`` (original score, attempt not counted).
        Costs one ZCOUNT per full window; more only when there is an inversion."""
        lowest = min(job.payload.priority for job in jobs)
        # Pending requests of strictly higher priority score below the lowest one's band.
        higher = int(await self.redis.zcount(self.keys.pending, "-inf",
                                             f"({scores.band(lowest)}"))
        if higher == 0:
            return False
        newer = await self._claim(min(higher, len(jobs)))
        ranked = sorted(jobs + newer, key=lambda j: (-j.payload.priority, j.claimed.enqueued_ms))
        keep = ranked[:len(jobs)]
        displaced = ranked[len(jobs):]
        self._carry = keep
        self.metrics.preemptions.labels(self.keys.queue).inc(
            sum(1 for job in keep if job in newer))
        await self._release(displaced, why="displaced by higher priority")
        return True

    def _release_batch(self, jobs: list[Job], budget: int | None,
                       reason: ReleaseReason) -> Batch:
        suspect = next((job for job in jobs if job.claimed.attempt >= 2), None)
        if suspect is not None:
            # Its previous attempt crashed a worker or failed: it runs alone, so it cannot
            # burn other requests' attempts.
            self._carry = [job for job in jobs if job is not suspect]
            return Batch(id=next(self._batch_ids), jobs=[suspect], reason=ReleaseReason.WINDOW,
                         padding_efficiency=1.0, released_at=self.clock(),
                         extra={"real": suspect.tokens, "padded": suspect.tokens,
                                "isolated": True})
        packed = pack(jobs, _job_tokens, max_count=self.window_config.max_batch_size,
                      max_tokens=budget)
        self._carry = packed.rest
        return Batch(id=next(self._batch_ids), jobs=packed.batch, reason=reason,
                     padding_efficiency=packed.padding_efficiency, released_at=self.clock(),
                     extra={"real": packed.real_tokens, "padded": packed.padded_tokens})

    async def _expire_overdue(self, now: float) -> bool:
        """Answer 'expired' for claimed jobs whose deadline passed in the window."""
        overdue = [job for job in self._carry if job.deadline is not None and job.deadline <= now]
        if not overdue:
            return False
        self._carry = [job for job in self._carry if job not in overdue]
        now_ms = self.link.to_ms(now)
        error = DeadlineExceeded("the deadline passed before the request could run")
        await self._complete([failed_completion(self.ctx, job.claimed, error, now_ms,
                                                Status.EXPIRED) for job in overdue])
        return True

    async def _claim(self, max_count: int) -> list[Job]:
        reply = await self.link.claim(max_count)
        self._next_retry_s = (None if reply.next_retry_ms is None
                              else max(reply.next_retry_ms / 1e3, 0.001))
        if not reply.claimed:
            return []
        loop = asyncio.get_running_loop()
        jobs, failures = await loop.run_in_executor(
            self._prepare_pool, self._prepare, reply.claimed, reply.now_ms)
        if failures:
            await self._complete(failures)
        for job in jobs:
            self.policy.record_arrivals(job.arrival, 1)
        return jobs

    def _prepare(self, claimed: Sequence[ops.Claimed],
                 now_ms: int) -> tuple[list[Job], list[ops.Completion]]:
        """Decode, validate and tokenize (helper thread). Bad requests fail alone, here."""
        valid, failures = decode_claims(self.ctx, claimed, now_ms)
        inputs: list[ModelInput | InferqError]
        try:
            inputs = self.model.prepare([p for _, p in valid])
        except Exception:  # a tokenizer crash on one input must not fail the others
            inputs = [self._prepare_one(p) for _, p in valid]
        jobs: list[Job] = []
        offset = now_ms / 1e3 - self.clock()
        for (c, payload), prepared in zip(valid, inputs, strict=True):
            if isinstance(prepared, InferqError):
                failures.append(failed_completion(self.ctx, c, prepared, now_ms))
                continue
            jobs.append(Job(
                claimed=c, payload=payload, input=prepared,
                arrival=c.enqueued_ms / 1e3 - offset,
                deadline=None if c.deadline_ms is None else c.deadline_ms / 1e3 - offset,
                claimed_ms=now_ms,
            ))
        return jobs, failures

    def _prepare_one(self, payload: RequestPayload) -> ModelInput | InferqError:
        try:
            return self.model.prepare([payload])[0]
        except Exception as exc:
            return InvalidInput(f"cannot prepare input: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------------------ executor

    async def _execute_loop(self) -> None:
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        while True:
            self._device_idle.set()
            batch = await self._ready.get()
            if batch is None:
                return
            if self._stopping.is_set():
                await self._release(batch.jobs)
                continue
            self._device_idle.clear()
            inputs = [job.input for job in batch.jobs]
            log.debug("batch %d: running %d requests", batch.id, len(batch.jobs))
            started = self.clock()
            outcomes = await loop.run_in_executor(self._forward_pool, self._forward, inputs)
            elapsed = self.clock() - started
            self._device_idle.set()
            if not any(isinstance(o, Failure) for o in outcomes):
                self.policy.observe_batch(len(batch.jobs), elapsed)
                self.memory.on_success(max(i.tokens for i in inputs), len(inputs))
            self._unpublished = True
            self.stats.record_batch(len(batch.jobs), batch.reason.value, batch.extra["real"],
                                    batch.extra["padded"], elapsed)
            self._observe_batch(batch, elapsed)
            task = asyncio.create_task(self._finish(batch, outcomes, elapsed))
            self._completions.add(task)
            task.add_done_callback(self._completions.discard)

    def _observe_batch(self, batch: Batch, elapsed: float) -> None:
        m, q = self.metrics, self.keys.queue
        m.batch_size.labels(q).observe(len(batch.jobs))
        m.batch_fill.labels(q).observe(len(batch.jobs) / self.window_config.max_batch_size)
        m.padding.labels(q).observe(batch.padding_efficiency)
        m.releases.labels(q, batch.reason.value).inc()
        m.tokens.labels(q).inc(batch.extra["real"])
        m.forward.labels(q).observe(elapsed)

    def _forward(self, inputs: Sequence[ModelInput]) -> list[Any]:
        """On the model thread: the forward pass, bisected on errors and out of memory."""
        def oom(items: Sequence[ModelInput]) -> None:
            width = max(item.tokens for item in items)
            self.memory.on_oom(width, len(items))
            free_device_cache(self.model.device)
            self.metrics.oom_splits.labels(self.keys.queue).inc()
            log.warning("out of memory on %d x %d tokens: splitting; budget for this length is "
                        "now %s tokens", len(items), width, self.memory.budget(width))

        return run_isolated(self.model.forward, inputs, on_oom=oom)

    async def _finish(self, batch: Batch, outcomes: list[Any], elapsed: float) -> None:
        finished_ms = self.link.now_ms()
        completions = [
            job_result(self.ctx, job, outcome, batch_size=len(batch.jobs),
                       finished_ms=finished_ms, compute_ms=elapsed * 1e3)
            for job, outcome in zip(batch.jobs, outcomes, strict=True)
        ]
        await self._complete(completions)
        for job, completion in zip(batch.jobs, completions, strict=True):
            if completion.status != "retry":
                priority = str(job.payload.priority)
                self.metrics.queue_wait.labels(self.keys.queue, priority).observe(
                    max(job.claimed_ms - job.claimed.enqueued_ms, 0) / 1e3)
                self.metrics.claim_to_result.labels(self.keys.queue, priority).observe(
                    max(finished_ms - job.claimed_ms, 0) / 1e3)
        log.debug("batch %d: %d requests, %.1f ms, released by %s", batch.id, len(batch.jobs),
                  elapsed * 1e3, batch.reason.value)

    async def _complete(self, completions: Sequence[ops.Completion]) -> None:
        written = await self.link.complete(completions)
        if written is None:
            return
        for completion, ok in zip(completions, written, strict=True):
            self.metrics.observe_outcome(completion.status, ok)
            if not ok:
                self.stats.refused += 1
                log.warning("completion of %s refused: lease lost or request cancelled",
                            completion.id)
            elif completion.status == "retry":
                self.stats.retried += 1
            elif completion.status != "ok":
                self.stats.failed += 1

    async def _release(self, jobs: Sequence[Job], why: str = "") -> None:
        self.stats.released += await self.link.release(
            [(j.id, j.claimed.token) for j in jobs], why)

    # --------------------------------------------------------------------------- maintenance

    async def _publish(self) -> None:
        """Window and batch statistics for ``inferq stats``, plus the tuned state."""
        now = self.clock()
        fields = self.stats.as_fields()
        fields.update({
            "window_ms": f"{self.policy.window_s(now) * 1e3:.3f}",
            "target_batch_size": str(self.policy.target_batch_size(now)),
            "arrival_rate": f"{self.policy.arrivals.rate(now):.3f}",
            "latency_a_ms": f"{self.policy.latency.a * 1e3:.4f}",
            "latency_b_ms": f"{self.policy.latency.b * 1e3:.4f}",
            "model": self.model.model_id,
            "device": self.model.device,
        })
        await self.link.publish_stats(fields)
        await save_policy(self.redis, self.keys, self.model.model_id, self.policy)
        m, q = self.metrics, self.keys.queue
        m.window.labels(q).set(self.policy.window_s(now))
        m.target_batch.labels(q).set(self.policy.target_batch_size(now))
        self._unpublished = False
