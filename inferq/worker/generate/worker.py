"""The ``generate`` worker: iteration-level batching over the Redis queue, with token streams.

The model thread (``steploop``) runs decode steps back to back; the stream publisher
(``publisher``) writes their text and results. Here, on the event loop: claiming as many
requests as there will be free slots at the next step boundary (free slots, plus sequences
finishing by length in the step in flight) while the step runs, so new requests join the
running batch at the next step. It claims only what it can admit: the backlog stays in Redis,
in priority order, where any worker can take it. On SIGTERM/SIGINT it stops claiming, gives
waiting claims back at once, and finishes the generations in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisError

from inferq import tracing
from inferq.errors import MODEL_ERROR, InferqError, InvalidInput
from inferq.protocol import ops
from inferq.protocol.codec import ErrorInfo
from inferq.protocol.generation import parse_generation_params
from inferq.protocol.prefix import identities_of
from inferq.worker.core.backoff import RedisBackoff
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.failures import Failure
from inferq.worker.core.lifecycle import QueueWorker, cancel
from inferq.worker.core.queue_link import ScriptPipeline
from inferq.worker.core.results import (
    Claim,
    decode_claims,
    expired,
    failed_completion,
    is_suspect,
    ran_before,
)
from inferq.worker.core.wake import wait_any
from inferq.worker.generate.affinity import (
    HeldPublisher,
    affinity_fields,
    claim_mode,
    held_ttl_ms,
    saturated,
)
from inferq.worker.generate.engine import Engine, Generation
from inferq.worker.generate.engine_client import EngineProcess
from inferq.worker.generate.publisher import (
    PUBLISHER_SCRIPTS,
    StreamClaim,
    StreamPublisher,
    claim_of,
    streamed,
)
from inferq.worker.generate.scheduler import Budget, preemptible
from inferq.worker.generate.served import ServedPrefixes
from inferq.worker.generate.settings import GenerationSettings, describe_budget
from inferq.worker.generate.stats import GenerationStats
from inferq.worker.generate.steploop import StepLoop, Steps
from inferq.worker.generate.vllm.sampling import check_supported
from inferq.worker.generate.wire import EngineSpec
from inferq.worker.models.lm import CausalLM

log = logging.getLogger("inferq.worker")

#: A full worker reads the head of pending at most once per stream interval, and never more
#: often than this (a stream interval of 0 writes every step).
MIN_HEAD_INTERVAL_S = 0.005


class GenerationWorker(QueueWorker[Generation]):
    finishing = "the generations in hand"
    stats: GenerationStats
    publisher: StreamPublisher

    def __init__(self, config: WorkerConfig, lm: CausalLM,
                 settings: GenerationSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, device=lm.device, clock=clock)
        self.lm = lm
        self.settings = settings or GenerationSettings()
        #: Whether ``budget`` is the one the model runs under. With an engine process, the
        #: model's weights (and so the memory left for the KV cache) are only there: it sizes
        #: the budget once they are loaded and sends it when ready (``_adopt_budget``, again
        #: after each restart). Until then capacity is 0, so nothing is claimed, prepared or
        #: checked against the stand-in, and no budget is published.
        self.budget_known = not self.settings.engine_process
        self.budget = (self.settings.budget(lm) if self.budget_known
                       else self.settings.provisional_budget(lm))
        # Here, with an engine process, it only prepares generations (no forward, no cache).
        self.engine = Engine(lm, self.budget, clock=clock, prefix_cache_bytes=(
            self.settings.prefix_cache_bytes if self.budget_known else 0))
        self.stats = GenerationStats()
        #: vLLM's prefix cache cannot be read: the identities of what it served stand for it.
        self.served = ServedPrefixes() if self.settings.engine == "vllm" else None
        self._order = itertools.count()
        self._maybe_pending = True
        #: When the head of pending was last read by a full worker, and how often it may be.
        self._head_read_at = -1e9
        self._head_interval_s = max(self.settings.stream_interval_ms / 1e3,
                                    MIN_HEAD_INTERVAL_S)
        self._wakes = 0
        self._retry_at: float | None = None
        self._helpers: tuple[asyncio.Task[None], ...] = ()
        self._loop_error: BaseException | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        # Cancellations first: BLPOP serves its lists in order, and the wake list of a busy
        # queue is never empty.
        self._cancels_key = self.keys.cancels(config.worker_id)
        if self.budget_known:
            log.info(describe_budget(self.budget, lm.kv))

    @property
    def running(self) -> list[Generation]:
        steps = getattr(self, "steps", None)  # None until the worker starts
        if isinstance(steps, EngineProcess):
            return steps.held()[0]
        return self.engine.running

    # ----------------------------------------------------------------------------- lifecycle

    def _wake_keys(self) -> Sequence[str]:
        return (self._cancels_key, self.keys.wake)

    async def _start(self) -> None:
        self._nudge = asyncio.Event()
        #: Set once an engine process is ready (its first ``Ready``).
        self._engine_up = asyncio.Event()
        events = _LoopEvents(self, asyncio.get_running_loop())
        self.steps: Steps
        if self.settings.engine_process:
            engine = EngineProcess(self._engine_spec(), events)
            self.metrics.device_memory_source = lambda: engine.device_memory
            if self.settings.engine == "vllm":
                self.metrics.engine_stats_source = lambda: engine.engine_stats
            self.steps = engine
        else:
            self.steps = StepLoop(self.engine, events,
                                  max_preemptions=self.settings.max_preemptions,
                                  swap_bytes=self.settings.swap_bytes, clock=self.clock)
        pipeline = ScriptPipeline(self._connect(), PUBLISHER_SCRIPTS)
        await pipeline.load()
        self.publisher = StreamPublisher(self.link, self.stats, self.steps, pipeline,
                                         self.settings.stream_interval_ms / 1e3,
                                         self.budget.max_slots)
        self.held = HeldPublisher(self.link, self.steps, held_ttl_ms(self.config.lease_ms),
                                  lambda: saturated(self.steps, self.engine), clock=self.clock,
                                  cached=None if self.served is None else self.served.held)
        if self.served is not None or self.settings.prefix_cache_mb > 0:
            self.link.affinity = self._affinity
        if isinstance(self.steps, EngineProcess):
            self.steps.start()
            await self._engine_ready()

    async def _engine_ready(self) -> None:
        """Until the engine process has loaded the model (vLLM: compiled and warmed up) and
        sized its budget, or a stop. ``_start`` runs before the worker registers its queue and
        beats its first heartbeat: a worker whose engine cannot serve yet is not advertised
        (not live in ``inferq stats`` or the autoscaling signal, its model not in the
        gateway's ``/v1/models``), so no client sends a burst that would wait for the load."""
        assert self._stopping is not None
        started = self.clock()
        await wait_any((self._engine_up, self._stopping))
        if self._engine_up.is_set():
            log.info("engine ready after %.1f s: advertising the worker", self.clock() - started)

    def _engine_spec(self) -> EngineSpec:
        import torch

        # The dtype as asked for: "auto" is resolved in the engine process, so this process
        # never probes (and holds a context on) the GPU.
        return EngineSpec(path=self.lm.source, device=self.lm.device,
                          dtype=self.config.dtype,
                          model_id=self.lm.model_id, settings=self.settings,
                          torch_threads=torch.get_num_threads(),
                          log_level=logging.getLogger("inferq").getEffectiveLevel(),
                          engine=self.settings.engine,
                          vllm_options=dict(self.settings.vllm_options))

    def _adopt_budget(self, budget: Budget) -> None:
        """The budget the engine process sized after loading the weights (called on its reader
        thread, before its capacity may say > 0)."""
        self.budget = budget
        self.engine.budget = budget
        self.publisher.max_slots = budget.max_slots
        self.metrics.target_batch.labels(self.keys.queue).set(budget.max_slots)
        self.budget_known = True  # last: whoever reads it True reads this budget
        log.info("%s (sized by the engine process)", describe_budget(budget, self.lm.kv))

    def _describe(self) -> str:
        where = "in an engine process" if self.settings.engine_process else "in a thread"
        return (f"with continuous batching (device {self.lm.device}, {self.settings.engine} "
                f"engine {where})")

    def _summary(self) -> str:
        s = self.stats
        return (f"{s.steps} steps ({s.admission_steps} admitting), {s.completed} requests, "
                f"{s.tokens} tokens")

    def _health_detail(self) -> Mapping[str, Any]:
        return {"steps": self.stats.steps, "running": self.steps.running_count}

    async def _serve(self) -> None:
        if not isinstance(self.steps, EngineProcess):  # an engine process started in _start
            self.steps.start()
        waker = asyncio.create_task(self._wake_loop(), name="wake loop")
        publisher = asyncio.create_task(self.publisher.run(), name="stream publisher")
        assert self._stopping is not None
        held = asyncio.create_task(self.held.run(self._stopping), name="held prefixes")
        self._helpers = (waker, publisher, held)
        for helper in self._helpers:  # one that dies wakes the claim loop, which fails
            helper.add_done_callback(lambda _: self._nudge.set())
        try:
            await self._claim_loop()
        finally:
            await self._release_generations(await self.steps.withdraw(_unstarted))
            self.steps.stop()
            await asyncio.wait({asyncio.ensure_future(asyncio.to_thread(self.steps.join))},
                               timeout=self.config.drain_timeout_s)
            await self._release_generations(await self.steps.withdraw())
            await cancel(waker)
            await cancel(held)
            with contextlib.suppress(RedisError):
                await self.held.clear()
            await asyncio.sleep(0)  # callbacks the model thread scheduled last
            self.publisher.stop()
            # The publisher writes what the last steps produced (retried for at most a lease).
            await asyncio.wait({publisher}, timeout=self.config.lease_ms / 1e3 + 1)
            if not await cancel(publisher):
                log.warning("the stream publisher did not stop")

    # ---------------------------------------------------------------------------- claiming

    async def _claim_loop(self) -> None:
        """Claim whenever slots will be free at the next step boundary and work may be
        pending; while every slot is taken, watch the head of pending for work that would
        preempt (``_claim_preempting``); sleep on a nudge (capacity freed, wake token, due
        retry) otherwise."""
        assert self._stopping is not None
        backoff = RedisBackoff("generation claims")
        while not self._stopping.is_set():
            self._nudge.clear()
            self._check_helpers()
            await self._expire_waiting()
            free = self.steps.capacity()
            timeout = None if self._retry_at is None else max(0.0, self._retry_at - self.clock())
            try:
                if free > 0 and self._maybe_pending:
                    await self._claim_free(free)
                    backoff.succeeded()
                    continue
                if free <= 0 and self._watches_head():
                    wait = self._head_read_at + self._head_interval_s - self.clock()
                    if wait <= 0:
                        claimed = await self._claim_preempting()
                        backoff.succeeded()
                        if claimed:
                            continue
                        wait = self._head_interval_s
                    timeout = wait if timeout is None else min(timeout, wait)
            except RedisError as exc:
                await backoff.failed(exc, self._stopping)
                continue
            await wait_any((self._nudge, self._stopping), timeout)
            if self._retry_at is not None and self.clock() >= self._retry_at:
                self._retry_at = None
                self._maybe_pending = True

    def _affinity(self) -> tuple[str, int]:
        """The claim's cache-affinity arguments (``affinity.claim_mode``)."""
        settings = self.link.settings
        if settings.affinity == "off":
            return "", 0
        return claim_mode(settings.affinity, settings.affinity_max_wait_ms,
                          saturated(self.steps, self.engine))

    def _watches_head(self) -> bool:
        """Whether a full device watches pending for higher priorities: preemption is on and
        the engine is serving."""
        return self.settings.max_preemptions > 0 and self.budget_known

    async def _claim_preempting(self) -> bool:
        """Every slot is taken: read the head of pending (every shard, one round trip) and,
        when running sequences may be preempted for it (``scheduler.preemptible``, the rule the
        engine applies), claim as many requests of that priority as there are such sequences
        (less those already waiting in the engine for them). The engine preempts for them at its
        next step boundary. True when something was claimed."""
        self._head_read_at = self.clock()
        running, waiting = self.steps.held()
        if any(g.alone for g in (*running, *waiting)):
            return False  # nothing joins a batch that drains for a request running alone
        limit = self.settings.max_preemptions
        if not preemptible(running, None, max_preemptions=limit):
            return False
        head = await self.link.head_priority()
        self.stats.head_reads += 1
        if head is None:
            return False
        victims = preemptible(running, head, max_preemptions=limit)
        if not victims:
            return False
        count = len(victims) - sum(1 for g in waiting if g.priority >= head)
        if count <= 0:
            return False
        return await self._claim_free(count, min_priority=head) > 0

    def _check_helpers(self) -> None:
        """Claiming without the wake loop, the publisher or the step loop would serve
        nothing: their end (an unexpected error) ends the worker ("cannot go on")."""
        assert self._stopping is not None
        if (failed := self._loop_error) is not None:
            raise RuntimeError(f"the step loop failed: {type(failed).__name__}: {failed}"
                               ) from failed
        for helper in self._helpers:
            if helper.done() and not self._stopping.is_set():
                exc = None if helper.cancelled() else helper.exception()
                raise RuntimeError(f"the {helper.get_name()} ended"
                                   + (f": {type(exc).__name__}: {exc}" if exc else ""))

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

    async def _claim_free(self, free: int, *, min_priority: int | None = None) -> int:
        """Claim up to ``free`` requests (of at least ``min_priority``) and hand them to the
        model thread; how many were claimed."""
        wakes = self._wakes
        reply, prepared, failures = await self._claim_generations(free, min_priority)
        self.link.follow_shards(self._wake, self._cancels_key)  # wake on any shard
        done = [g for g in prepared if g.finish is not None]
        generations = [g for g in prepared if g.finish is None]
        if done:
            self.publisher.finished(done)
        self._retry_at = (None if reply.next_retry_ms is None
                          else self.clock() + max(reply.next_retry_ms / 1e3, 0.001))
        if min_priority is None and len(reply.claimed) < free and wakes == self._wakes:
            # Pending is empty; the wake list says when it is not (a token that arrived while
            # this claim was in flight keeps the flag set).
            self._maybe_pending = False
        await self._complete(failures)
        # START right before they join the running batch (they are admitted at the next step
        # boundary: only as many are claimed as there will be free slots, or as they preempt).
        lost = await self.link.start([(g.id, claim_of(g).claimed.token) for g in generations])
        if lost is not None:  # None: Redis down for a whole lease; reclaimed unchanged
            started = [g for g in generations if g.id not in lost]
            self.steps.submit(started)
            if self.served is not None:
                self.served.note(i for g in started for i in g.identities)
        return len(reply.claimed)

    async def _claim_generations(self, max_count: int, min_priority: int | None
                              ) -> tuple[ops.ClaimReply, list[Generation], list[ops.Completion]]:
        """Claim, then read back (one pipelined XRANGE per request) the streams of requests
        that ran before, so that they go on from their streamed tokens."""
        reply = await self.link.claim(max_count, min_priority=min_priority)
        if not reply.claimed:
            return reply, [], []
        again = [c.id for c in reply.claimed if ran_before(c)]
        streams: dict[str, tuple[list[int], str]] = {}
        if again:
            async with self.redis.pipeline(transaction=False) as pipe:
                for request_id in again:  # the stream is in the request's shard
                    shard = self.keys.for_shard(self.link.book.shard(request_id))
                    pipe.xrange(shard.stream(request_id))
                replies = await pipe.execute()
            streams = {i: streamed(entries) for i, entries in zip(again, replies, strict=True)
                       if entries}

        def prepare() -> tuple[list[Generation], list[ops.Completion]]:
            claims, failures = decode_claims(self.config, reply.claimed, reply.now_ms,
                                             self.clock)
            if self.traces is not None:
                self.traces.claimed(claims)
            ready, rejected = self._prepare(claims, reply.now_ms, streams)
            return ready, failures + rejected

        ready, failures = await asyncio.get_running_loop().run_in_executor(
            self._prepare_pool, prepare)
        return reply, ready, failures

    def _prepare(self, claims: list[Claim], now_ms: int,
                 streams: Mapping[str, tuple[list[int], str]] | None = None
                 ) -> tuple[list[Generation], list[ops.Completion]]:
        """Validate, render and tokenize (helper thread). Bad requests fail here."""
        streams = streams or {}
        encoded = self.lm.encode([c.payload for c in claims]) if claims else []
        generations: list[Generation] = []
        failures: list[ops.Completion] = []
        for claim, ids in zip(claims, encoded, strict=True):
            try:
                if isinstance(ids, InferqError):
                    raise ids
                params = parse_generation_params(claim.payload.params)
                check_supported(params, self.settings.engine)
                if len(ids) >= self.lm.max_positions:
                    raise InvalidInput(f"the prompt has {len(ids)} tokens; the model's context "
                                       f"is {self.lm.max_positions}")
                tokens, shown = streams.get(claim.id, ((), ""))
                g = self.engine.new_generation(claim.id, ids, params,
                                               priority=claim.payload.priority,
                                               order=next(self._order),
                                               tag=StreamClaim.of(claim),
                                               alone=is_suspect(claim.claimed),
                                               streamed=tokens, shown=shown,
                                               trace_headers=self._trace_headers(claim),
                                               identities=identities_of(claim.payload))
                if not self._fits_alone(g):
                    raise InvalidInput(
                        f"prompt ({len(ids)} tokens) + max_new_tokens ({g.max_new}) exceed "
                        f"this worker's KV cache budget of {self.budget.kv_tokens} tokens")
            except InferqError as exc:
                failures.append(failed_completion(self.config, claim.claimed, exc, now_ms))
                continue
            generations.append(g)
        return generations, failures

    def _trace_headers(self, claim: Claim) -> dict[str, str] | None:
        """What vLLM's tracing continues (``--engine vllm``): the request's ``run`` span when
        this worker traces, else the context its payload carries; the engine passes it only
        when vLLM itself exports traces."""
        if self.settings.engine != "vllm":
            return None
        if self.traces is not None and (headers := self.traces.headers(claim.id)):
            return headers
        payload = claim.payload
        parent = tracing.Parent.parse(payload.traceparent, payload.tracestate)
        return None if parent is None else parent.headers()

    def _fits_alone(self, g: Generation) -> bool:
        if self.settings.engine == "vllm":  # paged: a sequence takes the blocks it fills
            return g.reserve_tokens <= self.budget.kv_tokens
        return self.engine.fits_alone(g)

    async def _expire_waiting(self) -> None:
        now = self.clock()
        overdue = await self.steps.withdraw(
            lambda g: (d := claim_of(g).deadline) is not None and d <= now)
        if overdue:
            await self._complete(expired(self.config, [claim_of(g) for g in overdue],
                                         self.link.to_ms(now)))

    async def _release_generations(self, generations: Sequence[Generation]) -> None:
        await self._release([claim_of(g) for g in generations])

    # ------------------------------------------------------ callbacks from the model thread

    def _on_loop_failed(self, error: BaseException) -> None:
        self._loop_error = error
        self._nudge.set()

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
        if self.traces is not None:
            for g in gone:
                self.traces.ended([g.id], "cancelled or lease lost",
                                  {"gen_ai.usage.output_tokens": len(g.tokens)})
        self._nudge.set()

    def _on_engine_died(self, why: str, started: list[Generation],
                        unstarted: list[Generation]) -> None:
        """The engine process is gone (the proxy starts a new one): the generations that
        had started fail (retried while attempts remain, each alone and from its streamed
        tokens), the others go back to the queue."""
        log.error("engine process %s with %d generations running and %d waiting: retrying "
                  "the running ones, giving the others back; starting a new engine process",
                  why, len(started), len(unstarted))
        self.stats.engine_restarts += 1
        if started:
            self.publisher.fail(Failure(ErrorInfo(
                code=MODEL_ERROR, message=f"the engine process {why}"), True), started)
        if unstarted:
            self._background(self._release_generations(unstarted))
        self._nudge.set()

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_step_failed(self, exc: Exception | Failure, victims: list[Generation]) -> None:
        log.warning("generation step failed for %d requests: %s", len(victims),
                    exc.error.message if isinstance(exc, Failure) else
                    f"{type(exc).__name__}: {exc}")
        self.publisher.fail(exc, victims)
        self._nudge.set()

    # ---------------------------------------------------------------------------- upkeep

    async def _upkeep(self, reclaimed: tuple[int, int]) -> None:
        if reclaimed[0]:
            self._maybe_pending = True
            self._nudge.set()
        await self._publish_stats()

    async def _publish_stats(self) -> None:
        fields = self.stats.as_fields(self.steps.running_count, self.steps.waiting_count)
        fields.update({"model": self.lm.model_id, "device": self.lm.device,
                       **self.metrics.dashboard_fields()})
        _, held, prompt, reused = self.steps.prefix_state()
        served = len(held) if self.served is None else len(self.served)
        fields.update(affinity_fields(self.metrics, served, prompt, reused))
        known, budget = self.budget_known, self.budget  # in this order: see _adopt_budget
        if known:  # not before the engine process sized it
            fields.update({"max_slots": str(budget.max_slots),
                           "kv_tokens": str(budget.kv_tokens)})
        await self.link.publish_stats(fields)
        m, q = self.metrics, self.keys.queue
        m.running.labels(q).set(self.steps.running_count)
        if known:
            m.target_batch.labels(q).set(self.steps.max_slots)


def _unstarted(g: Generation) -> bool:
    return not g.steps


class _LoopEvents:
    """The worker's ``EngineEvents``: each event handed to its event loop (they arrive on the
    step thread, or the engine process' pipe reader)."""

    def __init__(self, worker: GenerationWorker, loop: asyncio.AbstractEventLoop) -> None:
        self._worker = worker
        self._loop = loop

    def is_lost(self, request_id: str) -> bool:
        return self._worker.book.is_lost(request_id)

    def outputs_ready(self) -> None:
        self._loop.call_soon_threadsafe(self._worker.publisher.wake)

    def step_failed(self, error: Exception | Failure, victims: list[Generation]) -> None:
        self._loop.call_soon_threadsafe(self._worker._on_step_failed, error, victims)

    def left(self, gone: list[Generation]) -> None:
        self._loop.call_soon_threadsafe(self._worker._on_cancelled, gone)

    def capacity_changed(self) -> None:
        self._loop.call_soon_threadsafe(self._worker._nudge.set)

    def out_of_memory(self, sequences: int) -> None:
        self._loop.call_soon_threadsafe(self._worker._on_oom, sequences)

    def ready(self, budget: Budget) -> None:
        self._worker._adopt_budget(budget)  # before capacity may say > 0: at once
        self._loop.call_soon_threadsafe(self._worker._engine_up.set)

    def loop_failed(self, error: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._worker._on_loop_failed, error)

    def died(self, why: str, started: list[Generation], unstarted: list[Generation]) -> None:
        self._loop.call_soon_threadsafe(self._worker._on_engine_died, why, started, unstarted)
