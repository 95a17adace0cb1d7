"""Coalesce the enqueues of concurrent HTTP requests into one ``enqueue_many`` per event-loop
tick.

Under load, many HTTP requests are parsed in the same turn of the event loop; each used to pay
its own Redis round trip (a pipeline with one script call). The coalescer queues them and, at
the next turn of the loop (``call_soon``), sends every request queued meanwhile as one
``AsyncClient.enqueue_many`` (one pipeline: one script call per queue touched). Requests keep
their own model, task, priority and deadline: ``enqueue_many`` takes one mapping per request.

Each HTTP request still succeeds or fails alone:

* back-pressure: when the queue refuses some requests, the callers whose inputs were all
  accepted get their handles; a caller with a refused input gets ``QueueFull`` carrying the
  handles it did get in (the route cancels those: all or nothing per HTTP call);
* a caller that goes away before its enqueue is sent has its requests cancelled once they are
  in, so no worker computes what nobody reads;
* any other error of the combined call (a bad input that the route did not catch) makes the
  coalescer retry each caller's inputs on their own, so the error reaches only its caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferq.errors import QueuedTokensFull, QueueFull, WouldMissSlo
from inferq.producer.aio import AsyncClient, AsyncHandle

log = logging.getLogger("inferq.gateway")


@dataclass
class _Entry:
    requests: list[dict[str, Any]]
    future: asyncio.Future[list[AsyncHandle]]


@dataclass
class Coalescer:
    client: AsyncClient
    #: Most requests in one ``enqueue_many``; a larger tick is sent in several calls.
    max_batch: int = 4096
    _pending: list[_Entry] = field(default_factory=list)
    _scheduled: bool = False
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Calls sent and requests carried (for tests and logs).
    calls: int = 0
    requests: int = 0

    async def enqueue_many(self, prompts: Sequence[str], **fields: Any) -> list[AsyncHandle]:
        """As ``AsyncClient.enqueue_many(prompts, **fields)``, sharing its round trip with the
        other callers of this loop turn."""
        loop = asyncio.get_running_loop()
        entry = _Entry([{"prompt": p, **fields} for p in prompts], loop.create_future())
        self._pending.append(entry)
        if not self._scheduled:
            self._scheduled = True
            # In a context of its own: not the first caller's (its trace, its span).
            loop.call_soon(self._flush, context=contextvars.Context())
        try:
            return await asyncio.shield(entry.future)
        except asyncio.CancelledError:
            # The caller is gone (client disconnected): whatever gets in is cancelled again.
            entry.future.add_done_callback(self._abandoned)
            raise

    def _abandoned(self, future: asyncio.Future[list[AsyncHandle]]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        task = asyncio.get_running_loop().create_task(cancel_quietly(future.result()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        batch: list[_Entry] = []
        size = 0
        for entry in pending:
            if batch and size + len(entry.requests) > self.max_batch:
                self._start(batch)
                batch, size = [], 0
            batch.append(entry)
            size += len(entry.requests)
        if batch:
            self._start(batch)

    def _start(self, batch: list[_Entry]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Entry]) -> None:
        requests = [r for entry in batch for r in entry.requests]
        self.calls += 1
        self.requests += len(requests)
        try:
            handles = await self.client.enqueue_many(requests)
        except QueueFull as exc:
            self._split_refusal(batch, exc)
        except BaseException as exc:
            if len(batch) == 1 or isinstance(exc, asyncio.CancelledError):
                for entry in batch:
                    _fail(entry, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            # Whose input was it? Each caller on its own: the error reaches only its owner.
            await asyncio.gather(*(self._send([entry]) for entry in batch))
        else:
            start = 0
            for entry in batch:
                _resolve(entry, handles[start:start + len(entry.requests)])
                start += len(entry.requests)

    @staticmethod
    def _split_refusal(batch: list[_Entry], exc: QueueFull) -> None:
        refused = set(exc.refused)
        accepted = iter(exc.accepted)
        index = 0
        for entry in batch:
            mine = range(index, index + len(entry.requests))
            index += len(entry.requests)
            got = [next(accepted) for i in mine if i not in refused]
            if len(got) == len(entry.requests):
                _resolve(entry, got)
            else:
                _fail(entry, WouldMissSlo(
                    str(exc), predicted_ms=exc.predicted_ms, slo_ms=exc.slo_ms,
                    depth=exc.depth, accepted=got, retry_after_s=exc.retry_after_s)
                    if isinstance(exc, WouldMissSlo) else
                    QueuedTokensFull(
                        str(exc), tokens=exc.tokens, max_queued_tokens=exc.max_queued_tokens,
                        depth=exc.depth, accepted=got, retry_after_s=exc.retry_after_s)
                    if isinstance(exc, QueuedTokensFull) else
                    QueueFull(str(exc), depth=exc.depth, max_depth=exc.max_depth,
                              accepted=got, retry_after_s=exc.retry_after_s))


def _resolve(entry: _Entry, handles: list[AsyncHandle]) -> None:
    if not entry.future.done():
        entry.future.set_result(handles)


def _fail(entry: _Entry, exc: BaseException) -> None:
    if not entry.future.done():
        entry.future.set_exception(exc)


async def cancel_quietly(handles: Iterable[AsyncHandle]) -> None:
    """Best effort: cancel requests nobody will read any more (finished ones are untouched)."""
    handles = list(handles)
    if not handles:
        return
    outcomes = await asyncio.gather(*(h.cancel() for h in handles), return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        log.warning("could not cancel %d abandoned request(s): %s", len(failed), failed[0])
