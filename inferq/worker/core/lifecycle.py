"""The one lifecycle both workers share. ``run`` connects, checks the server, serves
``/metrics`` and ``/healthz``, registers the queue, starts the heartbeat thread, reclaims
expired leases once and starts the maintenance task; then the worker's ``_serve`` runs until a
stop is requested (SIGTERM/SIGINT, ``request_stop``) and drains; last, everything is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any, Generic, TypeVar

from redis.exceptions import RedisError

from inferq import connection
from inferq.protocol import ops
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.leases import Heartbeat, LeaseBook
from inferq.worker.core.metrics import HealthState, WorkerMetrics
from inferq.worker.core.metrics import serve as serve_metrics
from inferq.worker.core.queue_link import QueueLink
from inferq.worker.core.results import Claim, decode_claims
from inferq.worker.core.stats import WorkerStats
from inferq.worker.core.wake import WakeWaiter

log = logging.getLogger("inferq.worker")

T = TypeVar("T")  # what a worker prepares from a claim: a ``Job``, a ``Generation``


class QueueWorker(ABC, Generic[T]):
    """A worker's shared state and lifecycle. A subclass provides ``_prepare`` (helper thread:
    decoded claims to what it runs, and completions for those that cannot run), ``_serve``
    (until a stop, then drain), ``_publish_stats`` and ``_describe`` (the start log line);
    it may override ``_summary`` and ``_health_detail`` (the stop log line, ``/healthz``)."""

    #: What a stop still lets the worker finish (for the log).
    finishing = "the work in hand"
    stats: WorkerStats

    def __init__(self, config: WorkerConfig, *, device: str, clock: Callable[[], float]) -> None:
        self.config = config
        self.device = device
        self.clock = clock
        self.keys = QueueKeys.for_model(config.task, config.model_name, config.namespace)
        self.book = LeaseBook()
        self.metrics = WorkerMetrics(self.keys.queue, config.worker_id)
        self.health = HealthState(stale_after_s=max(10.0, config.lease_ms / 1e3))
        self.link = QueueLink(config, self.keys, self.book, self.metrics, clock)
        self.metrics_server: ThreadingHTTPServer | None = None
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-prepare")
        self._pools = [self._prepare_pool]
        self._clients: list[Any] = []
        self._stopping: asyncio.Event | None = None

    def request_stop(self) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            log.info("stopping: no new claims; finishing %s", self.finishing)
            self._stopping.set()

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        self._stopping = asyncio.Event()
        self.redis = self._connect()
        self.link.attach(self.redis, ops.register(self.redis))
        self._wake = WakeWaiter(self._connect(), *self._wake_keys())
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        await self.link.check_server()
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(self.metrics, self.health,
                                                self.config.metrics_port)
            log.info("metrics and /healthz on port %d", self.metrics_server.server_address[1])
        await self._start()
        await self.link.register_queue()
        heartbeat = Heartbeat(self.config.connection, self.keys, self.config.worker_id,
                              self.book, lease_ms=self.config.lease_ms,
                              interval_s=self.config.heartbeat_s)
        heartbeat.beat()
        heartbeat.start()
        await self.link.reclaim()
        log.info("worker %s serving %s %s", self.config.worker_id, self.keys.queue,
                 self._describe())
        maintenance = asyncio.create_task(self.link.maintain(
            self.health, self.device, upkeep=self._upkeep, detail=self._health_detail))
        try:
            await self._serve()
        finally:
            await cancel(maintenance)
            heartbeat.stop()
            with contextlib.suppress(RedisError):
                await self._publish_stats()
            await self._wake.close()
            for client in self._clients:
                await client.aclose()
            for pool in self._pools:
                pool.shutdown(wait=True)
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            log.info("worker %s stopped after %s", self.config.worker_id, self._summary())

    def _connect(self) -> Any:
        """A connection of this worker's, closed when it stops."""
        client = connection.async_client(self.config.connection)
        self._clients.append(client)
        return client

    # ------------------------------------------------------------------ claims and results

    async def _claim_prepared(self, max_count: int
                              ) -> tuple[ops.ClaimReply, list[T], list[ops.Completion]]:
        """Claim up to ``max_count`` requests and ``_prepare`` them on the helper thread: the
        reply, what is ready to run, and the completions of those that failed already."""
        reply = await self.link.claim(max_count)
        if not reply.claimed:
            return reply, [], []
        ready, failures = await asyncio.get_running_loop().run_in_executor(
            self._prepare_pool, self._decode_and_prepare, reply.claimed, reply.now_ms)
        return reply, ready, failures

    def _decode_and_prepare(self, claimed: Sequence[ops.Claimed],
                            now_ms: int) -> tuple[list[T], list[ops.Completion]]:
        claims, failures = decode_claims(self.config, claimed, now_ms, self.clock)
        ready, rejected = self._prepare(claims, now_ms)
        return ready, failures + rejected

    async def _complete(self, completions: Sequence[ops.Completion]) -> None:
        if not completions:
            return
        written = await self.link.complete(completions)
        if written is not None:
            self.stats.count(self.metrics, completions, written)

    async def _release(self, claims: Sequence[Claim], why: str = "") -> None:
        """Give claims that did not start back to pending (attempt not counted)."""
        self.stats.released += await self.link.release(
            [(c.id, c.claimed.token) for c in claims], why)

    # ------------------------------------------------------------------------------- hooks

    def _wake_keys(self) -> Sequence[str]:
        """The lists the wake-up BLPOP blocks on, in the order it serves them."""
        return (self.keys.wake,)

    async def _start(self) -> None:
        """After the server check, before the queue is registered and leases are kept."""

    async def _upkeep(self, reclaimed: tuple[int, int]) -> None:
        """Every maintenance round, after a reclaim; ``reclaimed``: (requeued, dead)."""
        await self._publish_stats()

    @abstractmethod
    def _prepare(self, claims: list[Claim], now_ms: int
                 ) -> tuple[list[T], list[ops.Completion]]: ...

    @abstractmethod
    async def _serve(self) -> None: ...

    @abstractmethod
    async def _publish_stats(self) -> None: ...

    @abstractmethod
    def _describe(self) -> str: ...

    def _summary(self) -> str:
        return f"{self.stats.batches} batches, {self.stats.batched} requests"

    def _health_detail(self) -> Mapping[str, Any]:
        return {"batches": self.stats.batches}


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it is done."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
