"""The one lifecycle both workers share. ``run`` connects, checks the server, serves
``/metrics`` and ``/healthz``, registers the queue, starts the heartbeat thread, reclaims
expired leases once and starts the maintenance task; then the worker's ``_serve`` runs until a
stop is requested (SIGTERM/SIGINT, ``request_stop``) and drains; last, everything is closed.

Stopping is bounded whatever Redis or redis-py do (a server that stops answering, a
cancellation swallowed mid-call): the drain gets ``drain_timeout_s``, after which the work in
hand is abandoned (its leases expire and it runs elsewhere); no cancelled task is awaited
without a time limit; and a watchdog thread force-exits the process (code ``EXIT_FORCED``)
``STOP_GRACE_S`` after the drain timeout if it is still alive. A ``_serve`` that fails (an
unexpected error) is a worker that cannot make progress: it logs "cannot go on", stops its
heartbeat at once (it must not look alive while serving nothing) and exits ``EXIT_FAILED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any, Generic, TypeVar

from inferq import connection, tracing
from inferq.protocol import ops
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.backoff import ride_out
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.leases import Heartbeat, LeaseBook
from inferq.worker.core.liveness import client_name
from inferq.worker.core.metrics import HealthState, WorkerMetrics
from inferq.worker.core.metrics import serve as serve_metrics
from inferq.worker.core.queue_link import QueueLink
from inferq.worker.core.results import Claim, decode_claims
from inferq.worker.core.stats import WorkerStats
from inferq.worker.core.traces import WorkerTraces
from inferq.worker.core.traces import make as make_traces
from inferq.worker.core.wake import BLOCK_S, WakeWaiter

log = logging.getLogger("inferq.worker")

#: Exit codes of ``run``: stopped as asked; could not go on (``_serve`` failed); forced out by
#: the stop watchdog (the stop overran its bound).
EXIT_OK, EXIT_FAILED, EXIT_FORCED = 0, 1, 3
#: After the drain timeout: time left for the close (stats, connections) before the watchdog
#: force-exits the process.
STOP_GRACE_S = 5.0
#: How long a cancelled task is waited for before it is left behind.
CANCEL_WAIT_S = 1.0
#: Read timeout of the worker's connections (the wake-up BLPOP blocks BLOCK_S more).
SOCKET_TIMEOUT_S = 10.0

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
        #: The worker's main connection (made in ``run``, inside its event loop).
        self.redis: Any = None
        self.heartbeat = Heartbeat(config.connection, self.keys, config.worker_id, self.book,
                                   lease_ms=config.lease_ms, interval_s=config.heartbeat_s)
        #: The idle wait for new work (its lists are ``_wake_keys``, given in ``run``).
        self._wake = WakeWaiter()
        self.metrics_server: ThreadingHTTPServer | None = None
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-prepare")
        self._pools = [self._prepare_pool]
        self._clients: list[Any] = []
        self._stopping: asyncio.Event | None = None
        #: Set when a stop's drain timeout passed with work still in hand.
        self.abandoned = False
        #: Set once the worker serves (started, registered, heartbeating): a stop may come.
        self.serving = asyncio.Event()
        self.watchdog = StopWatchdog(config.worker_id, hard_exit=False)
        #: Spans of the requests in hand (``core.traces``): None while tracing is off.
        self.traces: WorkerTraces | None = None

    def request_stop(self) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            log.info("stopping: no new claims; finishing %s (drain timeout %g s)",
                     self.finishing, self.config.drain_timeout_s)
            self.watchdog.arm(self.config.drain_timeout_s + STOP_GRACE_S, "stop")
            self.health.stopping()
            self._stopping.set()

    def _on_signal(self, signum: int) -> None:
        if self._stopping is not None and self._stopping.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            self.watchdog.exit_now()
        self.request_stop()

    async def run(self, *, install_signal_handlers: bool = True) -> int:
        """Serve until stopped; the exit code (``EXIT_OK`` or ``EXIT_FAILED``). With
        ``install_signal_handlers`` (the ``inferq worker`` process) SIGTERM/SIGINT stop it and
        the watchdog may end the process; without (a worker inside another program), the
        watchdog only logs."""
        self._stopping = asyncio.Event()
        self.watchdog = StopWatchdog(self.config.worker_id, hard_exit=install_signal_handlers)
        self.traces = self.link.traces = make_traces(self.config, self.link.now_ns)
        self.redis = self._connect()
        self.link.attach(self.redis, ops.register(self.redis))
        self._wake.connect(self._connect(), *self._wake_keys())
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        # Until the first beat: a server restarting now (a supervisor restarts workers at such
        # moments) is waited for, not a reason to exit.
        await ride_out(self.link.check_server, "start")
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(self.metrics, self.health,
                                                self.config.metrics_port)
            log.info("metrics and /healthz on port %d", self.metrics_server.server_address[1])
        await ride_out(self._start, "start")
        await ride_out(self.link.register_queue, "start")
        await asyncio.to_thread(self.heartbeat.first_beat)
        self.heartbeat.start()
        maintenance: asyncio.Task[None] | None = None
        code = EXIT_OK
        try:
            await ride_out(self.link.reclaim, "start")
            log.info("worker %s serving %s %s (lease %d ms, heartbeat %g ms, reclaim every "
                     "%g ms)", self.config.worker_id, self.keys.queue, self._describe(),
                     self.config.lease_ms, self.config.heartbeat_s * 1e3,
                     self.config.reclaim_s * 1e3)
            self.serving.set()
            maintenance = asyncio.create_task(self.link.maintain(
                self.health, self.device, upkeep=self._upkeep, detail=self._health_detail,
                stop=self._stopping))
            reason = await self._serve_bounded(maintenance)
            if reason is not None:
                code = EXIT_FAILED
                log.error("worker %s cannot go on: %s", self.config.worker_id, reason)
                self.watchdog.arm(STOP_GRACE_S, "close after a failure")
                self.heartbeat.stop()  # not alive for ``inferq stats`` while serving nothing
        finally:
            self._stopping.set()
            if maintenance is not None:
                await cancel(maintenance)
            self.heartbeat.stop()
            await bounded(self._publish_stats(), 2.0, "final stats")
            await bounded(self._wake.close(), CANCEL_WAIT_S, "wake-up wait")
            for client in self._clients:
                await bounded(client.aclose(), CANCEL_WAIT_S, "connection close")
            for pool in self._pools:
                # A forward abandoned at the drain timeout may still run: not waited for.
                pool.shutdown(wait=not self.abandoned, cancel_futures=True)
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            if self.traces is not None:
                await bounded(asyncio.to_thread(tracing.flush), 2.0, "trace export")
            log.info("worker %s stopped after %s", self.config.worker_id, self._summary())
            if not self.watchdog.hard_exit:
                self.watchdog.disarm()  # a process of its own stays watched until it exits
        return code

    async def _serve_bounded(self, maintenance: asyncio.Task[None]) -> str | None:
        """``_serve`` until it ends, or until a stop's drain timeout passes (then it is
        cancelled and, if the cancellation does not land, left behind). None, or why the worker
        cannot go on (``_serve`` failed, or the maintenance task that reclaims died)."""
        assert self._stopping is not None
        serve = asyncio.create_task(self._serve(), name="inferq-serve")
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({serve, stop, maintenance}, return_when=asyncio.FIRST_COMPLETED)
            if maintenance.done() and not self._stopping.is_set():
                exc = None if maintenance.cancelled() else maintenance.exception()
                log.error("maintenance failed", exc_info=exc)
                await cancel(serve)
                return "the maintenance loop ended" + (
                    f": {type(exc).__name__}: {exc}" if exc is not None else "")
            if not serve.done():
                await asyncio.wait({serve}, timeout=self.config.drain_timeout_s)
            if not serve.done():
                self.abandoned = True
                log.warning("drain timeout (%g s) passed: abandoning the work in hand; its "
                            "leases expire and it runs on another worker",
                            self.config.drain_timeout_s)
                await cancel(serve)
                return None
        finally:
            stop.cancel()
        if serve.cancelled():
            return None
        exc = serve.exception()
        if exc is not None:
            log.error("serving failed", exc_info=exc)
            return f"{type(exc).__name__}: {exc}"
        if not self._stopping.is_set():
            return "the serve loop ended without a stop"
        return None

    def _connect(self) -> Any:
        """A connection of this worker's, closed when it stops; named after the worker, so
        that its death is seen by the others' sweeps (``liveness``)."""
        client = connection.async_client(self.config.connection,
                                         socket_timeout=SOCKET_TIMEOUT_S + BLOCK_S,
                                         client_name=client_name(self.config.worker_id))
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
        if self.traces is not None:
            self.traces.claimed(claims)
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


async def cancel(task: asyncio.Future[Any], timeout: float = CANCEL_WAIT_S) -> bool:
    """Cancel ``task`` and wait for it at most ``timeout`` seconds (a cancellation swallowed
    inside redis-py must not hang the caller); whether it ended."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.warning("%s did not end within %g s of its cancellation; left behind",
                    task.get_name() if isinstance(task, asyncio.Task) else "a task", timeout)
        return False
    if not task.cancelled():
        task.exception()  # retrieved: an error while cancelling is not reported twice
    return True


async def run_together(*steps: Awaitable[Any]) -> None:
    """Run ``steps`` concurrently until all end; the first to fail cancels the others (each
    waited for at most ``CANCEL_WAIT_S``) and its error is raised, so no loop keeps running
    alone after its partner died."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        done, running = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            for task in running:
                await cancel(task)
            raise failed[0].exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()


async def bounded(step: Awaitable[Any], timeout: float, what: str) -> None:
    """Run one close step for at most ``timeout`` seconds; errors are logged, not raised."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.warning("%s took longer than %g s; skipped", what, timeout)
        await cancel(task)
    elif not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)


class StopWatchdog:
    """Ends the process when a stop overruns its bound: a thread, so it fires even if every
    task on the event loop is stuck. Armed once (the earliest deadline wins)."""

    def __init__(self, worker_id: str, *, hard_exit: bool) -> None:
        self.worker_id = worker_id
        self.hard_exit = hard_exit
        self.fired = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._deadline_s: float | None = None

    def arm(self, bound_s: float, why: str) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, args=(bound_s, why),
                                        name="inferq-stop-watchdog", daemon=True)
        self._thread.start()

    def _watch(self, bound_s: float, why: str) -> None:
        if self._done.wait(bound_s):
            return
        self.fired.set()
        log.error("worker %s did not finish its %s within %g s: forcing the exit (code %d)",
                  self.worker_id, why, bound_s, EXIT_FORCED)
        if self.hard_exit:
            self.exit_now()

    def disarm(self) -> None:
        """The stop finished in time (a worker inside another program: the process goes on)."""
        self._done.set()

    def exit_now(self) -> None:
        if not self.hard_exit:
            return
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(EXIT_FORCED)
