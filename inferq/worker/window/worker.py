"""The window worker: requests claimed in adaptive windows and run as whole batches.

One asyncio loop owns all Redis I/O. Two coroutines share it:

* the collector claims windows of requests (one Lua call each), decodes and tokenizes them on a
  helper thread, and decides with the adaptive ``WindowPolicy`` when to release a batch. While
  the model is busy it keeps claiming and tokenizing the next window (waiting is free then);
* the executor runs each batch's forward pass on the model thread (torch releases the GIL) and
  writes all results with one ``complete`` call per batch, overlapped with the next forward.

Why decoding and tokenizing stay on a thread of this process rather than in a process of
their own (as the generate worker's engine does): they already run while the forward is in
flight (the collector prepares the next window on the helper thread; the tokenizer and torch
release the GIL), and what is left between two forwards is measured as ``handoff_s`` in the
stats hash (the ``embed`` benchmark prints it, with how close the full stack comes to the bare
model: benchmarks/RESULTS.md); on a CPU machine a second process would not add cores, and the
per-request Python work on the loop is small (one pydantic call and one packer pass per
window, metrics per batch). What a split would still buy is a forward that never
waits for this process's GIL on a GPU, where a small model's forward is mostly Python kernel
launches: not measured here (no GPU).

Start, leases, reclaims and stop are the shared lifecycle's (``core.lifecycle``). On
SIGTERM/SIGINT the worker stops claiming, finishes the batch in hand, and gives unstarted
claims back at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import RedisError

from inferq.errors import InferqError, InvalidInput
from inferq.protocol import ops
from inferq.protocol.codec import RequestPayload
from inferq.worker.core.backoff import RedisBackoff
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.failures import Failure, free_device_cache
from inferq.worker.core.lifecycle import QueueWorker, run_together
from inferq.worker.core.results import (
    Claim,
    batch_cap,
    batch_completions,
    expired,
    failed_completion,
    is_suspect,
)
from inferq.worker.core.wake import wait_any
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.window.batch import Batch, Job
from inferq.worker.window.isolation import run_isolated
from inferq.worker.window.memory import MemoryGovernor
from inferq.worker.window.packing import fill_tokens, pack
from inferq.worker.window.policy import ReleaseReason, WindowConfig, WindowPolicy
from inferq.worker.window.stats import WindowStats

log = logging.getLogger("inferq.worker")


def _job_tokens(job: Job) -> int:
    return job.tokens


class WindowWorker(QueueWorker[Job]):
    finishing = "the batch in hand"
    stats: WindowStats

    def __init__(self, config: WorkerConfig, model: BatchModel, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, device=model.device, clock=clock)
        self.model = model
        self.window_config = WindowConfig(
            max_batch_size=config.max_batch_size,
            max_batch_tokens=config.max_batch_tokens,
            max_wait_s=config.max_wait_ms / 1e3,
        )
        self.policy = WindowPolicy(self.window_config)
        self.stats = WindowStats()
        self.memory = MemoryGovernor(config.max_batch_tokens)
        self.resumed_tuning = False
        self._carry: list[Job] = []
        self._batch_ids = itertools.count(1)
        self._forward_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-forward")
        self._pools.append(self._forward_pool)
        self._completions: set[asyncio.Task[None]] = set()
        self._unpublished = False
        self._next_retry_s: float | None = None
        #: Requests with a batch cap lead the queue (a crashed batch's, being bisected): claim
        #: no more than this at a time (see ``_share_capped``); None: no limit.
        self._cap_ahead: int | None = None
        #: The last claim was held back while capped requests lead the queue and the device
        #: is busy: they are left to idle workers.
        self._held_back = False
        #: Set while no forward runs; the next batch, handed from the collector to the
        #: executor (None: the collector ended).
        self._device_idle = asyncio.Event()
        self._device_idle.set()
        self._ready: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=1)

    # ----------------------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        state = await self.link.read_tuning(self.model.model_id)
        self.resumed_tuning = state is not None
        if state is not None:
            self.policy = WindowPolicy.from_state(self.window_config, state)

    def _describe(self) -> str:
        return (f"(device {self.model.device}, window max {self.config.max_wait_ms:.1f} ms, "
                f"batch max {self.config.max_batch_size}, "
                f"tuning {'resumed' if self.resumed_tuning else 'fresh'})")

    async def _serve(self) -> None:
        try:
            await run_together(self._collect_loop(), self._execute_loop())
        finally:
            if self._completions:
                await asyncio.gather(*self._completions, return_exceptions=True)
            await self._release(self._carry)
            self._carry = []

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
                self._device_idle.clear()  # committed from now: the executor runs it next
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
            if self.book.any_lost():
                lost = {job.id for job in self._carry if self.book.is_lost(job.id)}
                self.book.forget_lost(lost)
                self._carry = [job for job in self._carry if job.id not in lost]
            jobs = self._carry
            if len(jobs) < cfg.max_batch_size:
                jobs += await self._claim(cfg.max_batch_size - len(jobs))
            if not jobs and self._held_back:
                # Capped requests lead the queue and the device is busy: left to idle workers
                # until this one is free.
                await wait_any((self._device_idle, self._stopping))
                continue
            if not jobs:
                if self._unpublished:
                    await self._publish_stats()  # idle: make stats current before sleeping
                await self._wake.wait(self._next_retry_s, also=self._stopping)
                continue
            budget = self.memory.budget(max(job.tokens for job in jobs))
            tokens = fill_tokens(jobs, _job_tokens)
            # A capped request in hand (a crashed batch's half, a suspect) runs next, as soon
            # as the device is free: no wait.
            full = (len(jobs) >= cfg.max_batch_size or (budget is not None and tokens >= budget)
                    or any(batch_cap(job.claimed) for job in jobs))
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
        higher = await self.link.pending_above(min(job.payload.priority for job in jobs))
        if higher == 0:
            return False
        newer = await self._claim(min(higher, len(jobs)))
        if not newer:  # taken by another worker, or not claimable now: decide as before
            return False
        ranked = sorted(jobs + newer, key=lambda j: (-j.payload.priority, j.claimed.enqueued_ms))
        keep = ranked[:len(jobs)]
        displaced = ranked[len(jobs):]
        self._carry = keep
        self.metrics.preemptions.labels(self.keys.queue, "window_swap").inc(
            sum(1 for job in keep if job in newer))
        await self._release(displaced, why="displaced by higher priority")
        return True

    def _release_batch(self, jobs: list[Job], budget: int | None,
                       reason: ReleaseReason) -> Batch:
        suspect = next((job for job in jobs if is_suspect(job.claimed)), None)
        if suspect is not None:
            # It was lost with a worker while running alone, or is the last half of a crashed
            # batch: it runs alone, so that it cannot take others down with it.
            self._carry = [job for job in jobs if job is not suspect]
            return Batch(next(self._batch_ids), [suspect], ReleaseReason.WINDOW,
                         suspect.tokens, suspect.tokens)
        capped = [job for job in jobs if batch_cap(job.claimed)]
        max_count = self.window_config.max_batch_size
        if capped:
            # Bisection of a crashed batch: its requests run among themselves, in batches of
            # at most half the one they were lost in.
            max_count = min(max_count, *(batch_cap(job.claimed) for job in capped))
        packed = pack(capped or jobs, _job_tokens, max_count=max_count, max_tokens=budget)
        self._carry = packed.rest + ([job for job in jobs if not batch_cap(job.claimed)]
                                     if capped else [])
        return Batch(next(self._batch_ids), packed.batch, reason, packed.real_tokens,
                     packed.padded_tokens)

    async def _expire_overdue(self, now: float) -> bool:
        """Answer 'expired' for claimed jobs whose deadline passed in the window."""
        overdue = [job for job in self._carry if job.deadline is not None and job.deadline <= now]
        if not overdue:
            return False
        self._carry = [job for job in self._carry if job not in overdue]
        await self._complete(expired(self.config, overdue, self.link.to_ms(now)))
        return True

    async def _claim(self, max_count: int) -> list[Job]:
        """Claim up to ``max_count`` requests, keeping at most one capped batch in hand (see
        ``_share_capped``); none while one already waits to run, and, while capped requests
        lead the queue, none while the device is busy (idle workers take them) and no more
        than a batch's worth."""
        self._held_back = False
        if any(batch_cap(job.claimed) for job in self._carry):
            return []
        if self._cap_ahead is not None:
            if not self._device_idle.is_set():
                self._held_back = True  # see _build_batch
                return []
            max_count = min(max_count, self._cap_ahead)
        reply, jobs, failures = await self._claim_prepared(max_count)
        self.link.follow_shards(self._wake)  # idle, wake on any shard's enqueue
        self._next_retry_s = (None if reply.next_retry_ms is None
                              else max(reply.next_retry_ms / 1e3, 0.001))
        await self._complete(failures)
        jobs = await self._share_capped(jobs)
        self.policy.record_each_arrival([job.arrival for job in jobs])
        return jobs

    async def _share_capped(self, jobs: list[Job]) -> list[Job]:
        """Requests with a batch cap (the halves of a crashed batch; suspects, cap 1, run
        alone) run in batches of at most their cap. A window holding more of them than one
        such batch (a dead worker's whole batch, reclaimed) would run them one batch after
        another here; instead this worker keeps one batch (the smallest caps) and gives the
        others back at once (unchanged), so every live worker takes some and the fleet bisects
        in parallel. Until a claim brings no capped request, it then claims no more than one
        such batch at a time (no window claimed, decoded and given back at every round)."""
        capped = sorted((job for job in jobs if batch_cap(job.claimed)),
                        key=lambda j: batch_cap(j.claimed))
        if not capped:
            self._cap_ahead = None
            return jobs
        size = batch_cap(capped[0].claimed)
        extra = capped[size:]
        if extra or self._cap_ahead is not None:
            self._cap_ahead = size
        if not extra:
            return jobs
        await self._release(extra, why="a crashed batch's requests shared across workers")
        self.stats.suspects_shared += len(extra)
        gone = {job.id for job in extra}
        return [job for job in jobs if job.id not in gone]

    def _prepare(self, claims: list[Claim], now_ms: int
                 ) -> tuple[list[Job], list[ops.Completion]]:
        """Tokenize (helper thread). A tokenizer crash on one input must not fail the others:
        on one, every input is prepared alone."""
        inputs: list[ModelInput | InferqError]
        try:
            inputs = self.model.prepare([c.payload for c in claims])
        except Exception:
            inputs = [self._prepare_one(c.payload) for c in claims]
        jobs: list[Job] = []
        failures: list[ops.Completion] = []
        for claim, prepared in zip(claims, inputs, strict=True):
            if isinstance(prepared, InferqError):
                failures.append(failed_completion(self.config, claim.claimed, prepared, now_ms))
            else:
                jobs.append(Job(claim.claimed, claim.payload, claim.arrival, claim.deadline,
                                claim.claimed_ms, prepared))
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
        waiting_since: float | None = None  # a forward ended with claimed requests waiting
        while True:
            self._device_idle.set()
            batch = await self._ready.get()
            if batch is None:
                return
            if self._stopping.is_set():
                await self._release(batch.jobs)
                continue
            self._device_idle.clear()
            if not await self._start_batch(batch):
                continue
            inputs = [job.input for job in batch.jobs]
            log.debug("batch %d: running %d requests", batch.id, len(batch.jobs))
            started = self.clock()
            if waiting_since is not None:
                self.stats.record_handoff(started - waiting_since)
            outcomes = await loop.run_in_executor(self._forward_pool, self._forward, inputs)
            ended = self.clock()
            elapsed = ended - started
            if self.traces is not None:
                self.traces.group("batch", [job.id for job in batch.jobs],
                                  self.link.to_ns(started), self.link.to_ns(ended), {
                                      "inferq.batch.id": batch.id,
                                      "inferq.batch.reason": batch.reason.value,
                                      "inferq.batch.tokens": batch.real_tokens,
                                      "inferq.batch.padded_tokens": batch.padded_tokens},
                                  {"inferq.batch.id": batch.id,
                                   "inferq.batch.size": len(batch.jobs)})
            waiting_since = ended if self._carry else None
            self._device_idle.set()
            if not any(isinstance(o, Failure) for o in outcomes):
                self.policy.observe_batch(len(batch.jobs), elapsed)
                self.memory.on_success(max(i.tokens for i in inputs), len(inputs))
            self._unpublished = True
            self.stats.record(batch, elapsed)
            m, q = self.metrics, self.keys.queue
            m.observe_batch(len(batch.jobs), self.window_config.max_batch_size, elapsed,
                            batch.real_tokens)
            m.padding.labels(q).observe(batch.padding_efficiency)
            m.releases.labels(q, batch.reason.value).inc()
            task = asyncio.create_task(self._finish(batch, outcomes, elapsed))
            self._completions.add(task)
            task.add_done_callback(self._completions.discard)

    async def _start_batch(self, batch: Batch) -> bool:
        """START the batch right before its forward (from now on a lost lease costs each
        request an attempt); requests whose lease was lost meanwhile leave it. False when
        nothing is left to run."""
        lost = await self.link.start([(job.id, job.claimed.token) for job in batch.jobs])
        if lost is None:
            return False  # Redis down for a whole lease: the requests are reclaimed unchanged
        if lost:
            batch.jobs = [job for job in batch.jobs if job.id not in lost]
        return bool(batch.jobs)

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
        completions = batch_completions(self.config, batch.jobs, outcomes,
                                        [job.input.tokens for job in batch.jobs],
                                        finished_ms=finished_ms,
                                        compute_ms=round(elapsed * 1e3, 3),
                                        truncated=[job.input.truncated for job in batch.jobs])
        await self._complete(completions)
        self.metrics.observe_latencies(
            (job for job, done in zip(batch.jobs, completions, strict=True)
             if done.status != "retry"), finished_ms)
        log.debug("batch %d: %d requests, %.1f ms, released by %s", batch.id, len(batch.jobs),
                  elapsed * 1e3, batch.reason.value)

    # --------------------------------------------------------------------------- maintenance

    async def _publish_stats(self) -> None:
        """Window and batch statistics for ``inferq stats``, plus the tuned state."""
        now = self.clock()
        fields = self.stats.as_fields()
        fields.update({
            "window_ms": f"{self.policy.window_s(now) * 1e3:.3f}",
            "target_batch_size": str(self.policy.target_batch_size(now)),
            "arrival_rate": f"{self.policy.arrivals.rate(now):.3f}",
            "latency_a_ms": f"{self.policy.latency.a * 1e3:.4f}",
            "latency_b_ms": f"{self.policy.latency.b * 1e3:.4f}",
            "batch_limit": str(self.config.max_batch_size),
            **self.metrics.dashboard_fields(),
            "model": self.model.model_id,
            "device": self.model.device,
        })
        await self.link.publish_stats(fields,
                                      tuning=(self.model.model_id, self.policy.to_state()))
        m, q = self.metrics, self.keys.queue
        m.window.labels(q).set(self.policy.window_s(now))
        m.target_batch.labels(q).set(self.policy.target_batch_size(now))
        self._unpublished = False
