"""Waiting for new work without polling: block on the queue's wake list.

Enqueue pushes a token per new request (the list is capped at 64), so an idle worker sleeps in
``BLPOP`` until work arrives. One BLPOP is outstanding at a time on a dedicated connection; a
caller that stops waiting early leaves it running and picks up its answer on the next call,
so a blocking command is never cancelled mid-flight (which would poison the connection).
Several lists can share the wait (a ``generate`` worker also hears cancellations): BLPOP
serves them in the order given, and ``wait`` says which one answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

BLOCK_S = 1.0


class WakeWaiter:
    def __init__(self, client: aioredis.Redis, *keys: str) -> None:
        self._client = client
        self._keys = list(keys)
        self._task: asyncio.Task[Any] | None = None

    def set_keys(self, keys: Sequence[str]) -> None:
        """Block on these lists from the next BLPOP on (a sharded queue's wake lists)."""
        self._keys = list(keys)

    async def wait(self, timeout: float | None, *,
                   also: asyncio.Event | None = None) -> tuple[str, str] | None:
        """Wait until an element arrives (returned as ``(list key, element)``), ``also`` is
        set, or ``timeout`` passes (both: None)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._client.blpop(self._keys, timeout=BLOCK_S))
        if also is not None and also.is_set():
            return None
        await wait_any(() if also is None else (also,), timeout, or_done=self._task)
        if not self._task.done():
            return None
        task, self._task = self._task, None
        popped = task.result()
        if popped is None:
            return None
        key, element = popped
        return _text(key), _text(element)

    async def close(self, timeout: float = 1.0) -> None:
        """Cancel the BLPOP in flight and wait at most ``timeout`` for it (a cancellation that
        redis-py swallows must not hang the stop)."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.wait({task}, timeout=timeout)
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
