"""Waiting for new work without polling: block on the queue's wake list.

Enqueue pushes a token per new request (the list is capped at 64), so an idle worker sleeps in
``BLPOP`` until work arrives. One BLPOP is outstanding at a time on a dedicated connection; a
caller that stops waiting early leaves it running and picks up its answer on the next call,
so a blocking command is never cancelled mid-flight (which would poison the connection).
Several lists can share the wait (a ``generate`` worker also hears cancellations): BLPOP
serves them in the order given, and ``wait`` says which one answered.

On a Redis Cluster one BLPOP may name only keys of one slot, and a sharded queue's wake lists
sit in several; there the lists are grouped by slot, with one BLPOP outstanding per group
(each on a pooled connection to its node), and the first to answer wins.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from inferq.cluster import is_cluster_client

BLOCK_S = 1.0


class WakeWaiter:
    """The wake-up wait of one worker: made with its lists, given a connection by
    ``connect`` (when the worker starts)."""

    def __init__(self, *keys: str) -> None:
        self._client: Any = None
        self._cluster = False
        #: The lists it blocks on, in the order BLPOP serves them.
        self.keys = list(keys)
        self._groups = self._group(keys)
        #: The BLPOP in flight for each group of lists (left running between calls).
        self._tasks: dict[tuple[str, ...], asyncio.Task[Any]] = {}

    def connect(self, client: Any, *keys: str) -> None:
        """The connection to block on (and, if given, the lists)."""
        self._client = client
        self._cluster = is_cluster_client(client)
        self.set_keys(keys or self.keys)

    def _group(self, keys: Sequence[str]) -> list[tuple[str, ...]]:
        if not self._cluster:
            return [tuple(keys)]
        by_slot: dict[int, list[str]] = {}
        for key in keys:
            by_slot.setdefault(key_slot(key.encode()), []).append(key)
        return [tuple(group) for group in by_slot.values()]

    def set_keys(self, keys: Sequence[str]) -> None:
        """Block on these lists from the next BLPOP on (a sharded queue's wake lists); a BLPOP
        already in flight on the old ones is still heard once."""
        self.keys = list(keys)
        self._groups = self._group(keys)

    async def wait(self, timeout: float | None, *,
                   also: asyncio.Event | None = None) -> tuple[str, str] | None:
        """Wait until an element arrives (returned as ``(list key, element)``), ``also`` is
        set, or ``timeout`` passes (both: None)."""
        for group in self._groups:
            if group not in self._tasks:
                self._tasks[group] = asyncio.ensure_future(
                    self._client.blpop(list(group), timeout=BLOCK_S))
        if also is not None and also.is_set():
            return None
        waiters = [] if also is None else [asyncio.ensure_future(also.wait())]
        try:
            await asyncio.wait([*waiters, *self._tasks.values()], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        for group, task in list(self._tasks.items()):
            if not task.done():
                continue
            del self._tasks[group]
            popped = task.result()
            if popped is not None:
                key, element = popped
                return _text(key), _text(element)
        return None

    async def close(self, timeout: float = 1.0) -> None:
        """Cancel the BLPOPs in flight and wait at most ``timeout`` for them (a cancellation
        that redis-py swallows must not hang the stop)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            if task.done() and not task.cancelled():
                with contextlib.suppress(BaseException):
                    task.exception()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def wait_any(events: Sequence[asyncio.Event], timeout: float | None = None, *,
                   or_done: asyncio.Future[Any] | None = None) -> None:
    """Until one of ``events`` is set, ``or_done`` is done (it is left running otherwise), or
    ``timeout`` seconds pass."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([*waiters, *([] if or_done is None else [or_done])], timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
