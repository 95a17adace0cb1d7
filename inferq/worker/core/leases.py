"""The leases a worker holds, and the thread that keeps them alive.

The heartbeat runs on its own thread with its own connection, so a long forward pass or a busy
event loop never lets a lease lapse. It also marks the worker alive for ``inferq stats``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from inferq import connection
from inferq.connection import ConnectionSettings
from inferq.protocol import ops, scripts
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.backoff import STARTUP_WAIT_S
from inferq.worker.core.liveness import client_name

log = logging.getLogger("inferq.worker")


class LeaseBook:
    """Thread-safe map of request id -> lease token for everything this worker has claimed.
    The worker's hot path uses the ``*_many`` forms: one lock round per window, not per id."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}
        #: The shard of each lease not on shard 0 (a sharded queue).
        self._shards: dict[str, int] = {}
        self._lost: set[str] = set()
        #: Leases whose COMPLETE is on its way: a beat that finds them gone does not call
        #: them lost (the completion itself may have removed them a moment earlier).
        self._completing: set[str] = set()
        self._lock = threading.Lock()

    def add(self, request_id: str, token: str, shard: int = 0) -> None:
        self.add_many([(request_id, token)], shard)

    def add_many(self, leases: Iterable[tuple[str, str]], shard: int = 0) -> None:
        with self._lock:
            for request_id, token in leases:
                self._tokens[request_id] = token
                if shard:
                    self._shards[request_id] = shard
                if self._lost:
                    self._lost.discard(request_id)

    def drop(self, request_id: str) -> None:
        self.drop_many((request_id,))

    def drop_many(self, request_ids: Iterable[str]) -> None:
        with self._lock:
            tokens, shards, completing = self._tokens, self._shards, self._completing
            for request_id in request_ids:
                tokens.pop(request_id, None)
                if shards:
                    shards.pop(request_id, None)
                if completing:
                    completing.discard(request_id)

    def completing(self, request_ids: Iterable[str]) -> None:
        """These leases are being completed (see ``_completing``); ``drop_many`` ends it."""
        with self._lock:
            self._completing.update(request_ids)

    def shard(self, request_id: str) -> int:
        with self._lock:
            return self._shards.get(request_id, 0)

    def shards_of(self, request_ids: Sequence[str]) -> list[int]:
        with self._lock:
            if not self._shards:
                return [0] * len(request_ids)
            return [self._shards.get(request_id, 0) for request_id in request_ids]

    def by_shard(self) -> dict[int, list[tuple[str, str]]]:
        """The leases grouped by queue shard (shard 0 always present)."""
        with self._lock:
            if not self._shards:
                return {0: list(self._tokens.items())}
            groups: dict[int, list[tuple[str, str]]] = {0: []}
            for request_id, token in self._tokens.items():
                groups.setdefault(self._shards.get(request_id, 0), []).append(
                    (request_id, token))
            return groups

    def snapshot(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._tokens.items())

    def mark_lost(self, request_ids: list[str]) -> list[str]:
        """Forget these leases as lost (reclaimed, cancelled); returns those that were: a
        lease already dropped, or being completed, was not lost."""
        marked: list[str] = []
        with self._lock:
            for request_id in request_ids:
                if request_id in self._completing:
                    continue
                self._shards.pop(request_id, None)
                if self._tokens.pop(request_id, None) is not None:
                    self._lost.add(request_id)
                    marked.append(request_id)
        return marked

    def is_lost(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._lost

    def any_lost(self) -> bool:
        """Whether a lease is marked lost (a cheap test before ``is_lost`` per request)."""
        return bool(self._lost)

    def forget_lost(self, request_ids: Iterable[str]) -> None:
        """The worker let go of these lost leases' requests: no need to remember them."""
        with self._lock:
            self._lost.difference_update(request_ids)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokens)


class Heartbeat(threading.Thread):
    """Renews every lease in the book each ``interval_s`` (lease / 4 by default) and marks the
    worker alive. It owns its connection and needs neither the event loop nor the model
    thread, so a forward much longer than the lease, or a loop busy for seconds, keeps its
    leases. A failed beat is retried at once with a short backoff (capped at the interval):
    a lease survives as long as one beat in a lease period gets through."""

    def __init__(self, settings: ConnectionSettings | str, keys: QueueKeys, worker_id: str,
                 book: LeaseBook, *, lease_ms: int, interval_s: float) -> None:
        super().__init__(name="inferq-heartbeat", daemon=True)
        self._settings = settings
        #: Its own connection, made by the first beat (``first_beat``, off the event loop).
        self._redis: Any = None
        self._script: Any = None
        self._keys = keys
        self._worker_id = worker_id
        self._book = book
        self._lease_ms = lease_ms
        self._interval_s = interval_s
        self._halt = threading.Event()
        #: Beats that got through (tests and ``/healthz`` read it).
        self.beats = 0

    def _connect(self) -> None:
        # A beat that hangs must not outlive the lease it renews: bounded well below it.
        timeout = max(0.5, self._lease_ms / 2e3)
        # No retries inside redis-py: ``run`` retries on its own schedule.
        self._redis = connection.sync_client(self._settings, socket_timeout=timeout,
                                             socket_connect_timeout=timeout,
                                             retry=Retry(NoBackoff(), 0),
                                             client_name=client_name(self._worker_id))
        self._script = self._redis.register_script(scripts.ALL["heartbeat"])

    def beat(self) -> list[str]:
        if self._redis is None:
            self._connect()
        lost: list[str] = []
        for shard, leases in sorted(self._book.by_shard().items()):
            keys, args = ops.heartbeat_call(
                self._keys.for_shard(shard), self._worker_id, self._lease_ms,
                liveness_ms=int(self._interval_s * 3000), leases=leases,
            )
            lost += ops.parse_ids(self._script(keys=keys, args=args))
        self.beats += 1
        lost = self._book.mark_lost(lost)
        if lost:
            log.warning("lost %d leases (reclaimed by another worker or cancelled)", len(lost),
                        extra={"request_ids": lost[:20]})
        return lost

    def first_beat(self) -> None:
        """The beat that registers the worker, before it claims anything: retried with backoff
        through Redis errors for one lease (at least ``STARTUP_WAIT_S``, a server restarting),
        then the last error is raised."""
        give_up = time.monotonic() + max(STARTUP_WAIT_S, self._lease_ms / 1e3)
        delay = 0.05
        while True:
            try:
                self.beat()
                return
            except redis.RedisError:
                if time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def run(self) -> None:
        delay = self._interval_s
        failures = 0
        while not self._halt.wait(delay):
            try:
                self.beat()
            except Exception as exc:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("heartbeat failed (%d in a row): %s: %s", failures,
                                type(exc).__name__, exc)
                delay = min(self._interval_s, 0.05 * 2 ** min(failures - 1, 6))
                continue
            if failures:
                log.info("heartbeat back after %d failures", failures)
            failures = 0
            delay = self._interval_s

    def stop(self, *, deregister: bool = True) -> None:
        """Stop beating and mark the worker gone at once (instead of when liveness lapses).
        Bounded: a beat in flight ends within its socket timeout. Idempotent."""
        if self._halt.is_set():
            return
        self._halt.set()
        if self.is_alive():
            self.join(timeout=max(1.0, self._lease_ms / 1e3))
        if self._redis is None:
            return
        if deregister:
            try:
                pipe = self._redis.pipeline(transaction=False)
                pipe.zrem(self._keys.workers, self._worker_id)
                pipe.hdel(self._keys.conns, self._worker_id)
                pipe.execute()
            except redis.RedisError as exc:
                log.warning("could not deregister the worker: %s", exc)
        self._redis.close()
