"""Asyncio producer client: the same surface as ``Client``, with awaitables."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from operator import methodcaller
from types import TracebackType
from typing import Any, TypeVar, Unpack

import redis.asyncio as aioredis

from inferq import connection, plans, stats
from inferq.connection import ConnectionSettings, wrap_connection_errors
from inferq.plans import Plan
from inferq.producer.admin import AsyncDeadLetters
from inferq.producer.base import ClientBase
from inferq.producer.handle import HandleBase
from inferq.producer.inbox import ResultInbox
from inferq.producer.info import CancelOutcome, RequestInfo
from inferq.producer.options import BLOCKING_DEFAULTS, ClientOptions, EnqueueOptions
from inferq.producer.replies import RequestState, results_in_order
from inferq.producer.routing import queue_of
from inferq.producer.streaming import StreamEntry, StreamReader, follow, follow_entries
from inferq.protocol import ops
from inferq.protocol.codec import Result
from inferq.protocol.keys import QueueKeys, shard_of
from inferq.protocol.settings import QueueSettings

log = logging.getLogger("inferq.producer")

T = TypeVar("T")


class AsyncHandle(HandleBase["AsyncClient"]):
    """``Handle`` with awaitables: made by ``AsyncClient``."""

    async def result(self, timeout: float | None = None) -> Result:
        """Await the result (blocking on Redis, no polling); see ``Handle.result``."""
        if self._via_inbox:
            raw = await self._client.inbox(self.keys).wait(self.id, self._checked(timeout))
        else:
            raw = await self._run(self._wait(timeout))
        return self._outcome(raw, timeout)

    async def peek(self) -> Result | None:
        return await self._run(self._peek())

    async def stream(self, timeout: float | None = None) -> AsyncIterator[str | Result]:
        """``async for`` over a generation's text deltas, ending with its ``Result``; see
        ``Handle.stream``."""
        steps = follow(self.keys, self.id, timeout, self._client.options)
        with wrap_connection_errors(self._client.connection):
            for step in steps:
                while isinstance(step, methodcaller):  # a read: send its reply back
                    step = steps.send(await step(self._client.redis))
                yield step

    async def stream_entries(self, timeout: float | None = None, *, after: str = "0-0",
                             reader: StreamReader | None = None
                             ) -> AsyncIterator[StreamEntry | Result]:
        """``stream`` with each delta's Redis Stream entry id, from the entry after ``after``
        (resuming where a reader left off, e.g. an HTTP client's ``Last-Event-ID``).
        ``reader`` tracks the position; after the ``Result`` its ``last_id`` is the last
        entry's."""
        steps = follow_entries(self.keys, self.id, timeout, self._client.options, after, reader)
        with wrap_connection_errors(self._client.connection):
            for step in steps:
                while isinstance(step, methodcaller):
                    step = steps.send(await step(self._client.redis))
                yield step

    async def status(self) -> RequestState:
        return await self._run(self._status())

    async def cancel(self) -> CancelOutcome:
        return await self._run(self._cancel())

    async def info(self) -> RequestInfo:
        """State, attempts, owner and timings (one read-only round trip); see ``RequestInfo``."""
        return await self._run(self._info())

    async def _run(self, plan: Plan[T]) -> T:
        with wrap_connection_errors(self._client.connection):
            return await plans.run_async(self._client.redis, plan)


class AsyncClient(ClientBase[AsyncHandle]):
    handle_type = AsyncHandle

    def __init__(self, url: str | ConnectionSettings | None = None, *,
                 options: ClientOptions | None = None, **redis_kwargs: Any) -> None:
        """See ``Client``: a URL or ``ConnectionSettings``, and redis-py overrides."""
        super().__init__(url, options)
        # A blocking pool: more concurrent calls than connections wait for one instead of
        # failing. Awaited results do not hold connections (see ``ResultInbox``).
        self.redis: aioredis.Redis = connection.async_client(
            self.connection, blocking_pool=True, max_connections=self.options.max_connections,
            **{**BLOCKING_DEFAULTS, **redis_kwargs})
        self.scripts = ops.register(self.redis)
        self._inboxes: dict[QueueKeys, ResultInbox] = {}
        #: Reads of expired settings running in the background (``_cached_settings``).
        self._refreshing: dict[QueueKeys, asyncio.Task[None]] = {}

    async def _run(self, plan: Plan[T]) -> T:
        with wrap_connection_errors(self.connection):
            return await plans.run_async(self.redis, plan)

    async def queue_settings(self, keys: QueueKeys) -> QueueSettings:
        """The queue's settings (shards, depth limit, order, admission and the fleet's rates
        it reads), cached ``options.settings_ttl_s``."""
        return await self._run(self._settings_plan(keys))

    def _cached_settings(self, queue: QueueKeys) -> QueueSettings | None:
        """Once the settings' TTL has passed, for as long again the last ones are used while a
        read runs in the background, so an enqueue does not wait for the reads (several round
        trips under admission); older than that, or never read, they are read first."""
        known = self._settings.get(queue)
        if (known is None and (known := self._settings.recent(queue)) is not None
                and queue not in self._refreshing):
            task = asyncio.create_task(self._refresh(queue))
            self._refreshing[queue] = task
            task.add_done_callback(lambda _: self._refreshing.pop(queue, None))
        return known

    async def _refresh(self, queue: QueueKeys) -> None:
        """A background read: a failure leaves the last settings, which age out."""
        try:
            await self.queue_settings(queue)
        except Exception as exc:  # the next call past the staleness bound reads and raises
            log.debug("background read of %s's settings failed: %s", queue.queue, exc)

    def inbox(self, keys: QueueKeys) -> ResultInbox:
        box = self._inboxes.get(keys)
        if box is None:
            box = self._inboxes[keys] = ResultInbox(self.redis, keys, self.client_id)
        return box

    async def enqueue(self, prompt: str = "",
                      **request: Unpack[EnqueueOptions]) -> AsyncHandle:
        """Queue one request; the arguments are ``Client.enqueue``'s (``EnqueueOptions``)."""
        return await self._run(self._enqueue(prompt, request))

    async def enqueue_many(self, requests: Iterable[str | Mapping[str, Any]], *,
                           atomic: bool = False, **defaults: Any) -> list[AsyncHandle]:
        """See ``Client.enqueue_many`` (``atomic``: all or none; the tracing too)."""
        return await self._run(self._enqueue_many(requests, atomic, defaults))

    async def enqueue_items(self, keys: QueueKeys,
                            items: Sequence[ops.EnqueueItem]) -> ops.EnqueueReply:
        """Items made by ``prepare`` into queue shard ``keys``, in one enqueue script call, as
        they are: no routing (no shard, depth share or tenant weight from the queue's
        settings), no presence check, and no refusal raised: the reply's outcomes say which
        were queued (``replies.BACK_PRESSURE``: refused for now). The batch runner's door."""
        return await self._run(self._enqueue_items(keys, items))

    async def live_workers(self, *, model: str, task: str = "embed") -> list[str]:
        """See ``Client.live_workers``."""
        return await self._run(stats.all_live_workers(self._queue(model, task)))

    async def served_queues(self) -> frozenset[str]:
        """See ``Client.served_queues``."""
        return await self._run(stats.served_queues(self.options.namespace))

    async def find(self, request_id: str, *, model: str, task: str = "embed") -> AsyncHandle:
        """``handle``, after reading the queue's settings (cached): right on a sharded queue."""
        await self.queue_settings(self._queue(model, task))
        return self.handle(request_id, model=model, task=task)

    def dead_letters(self, *, model: str, task: str = "embed") -> AsyncDeadLetters:
        """The queue's dead letters: ``list``, ``show``, ``requeue``, ``purge`` (see
        ``inferq.producer.admin``)."""
        return AsyncDeadLetters(self.redis, self.scripts, self.connection,
                                self._queue(model, task))

    def handle(self, request_id: str, *, model: str, task: str = "embed") -> AsyncHandle:
        """A handle for a request enqueued elsewhere. On a sharded queue, its shard comes from
        the settings this client last read (``queue_settings``; one shard if never read)."""
        keys = self._queue(model, task)
        known = self._settings.get(queue_of(keys))
        shards = known.shards if known is not None else 1
        return AsyncHandle(self, keys.for_shard(shard_of(request_id, shards)), request_id,
                           "unknown")

    async def results(self, handles: Sequence[AsyncHandle], timeout: float | None = None
                      ) -> list[Result]:
        """See ``Client.results``: here one await for all of them (their inbox hands the
        results of this client's requests to one waiter, not a task and a future each)."""
        HandleBase._checked(timeout)
        raws: list[Any] = [None] * len(handles)
        groups: dict[QueueKeys, list[int]] = {}
        alone: list[int] = []
        for index, handle in enumerate(handles):
            if handle._via_inbox and handle._client is self:
                groups.setdefault(handle.keys, []).append(index)
            else:
                alone.append(index)

        async def from_inbox(keys: QueueKeys, indices: list[int]) -> None:
            got = await self.inbox(keys).wait_many([handles[i].id for i in indices], timeout)
            for index, raw in zip(indices, got, strict=True):
                raws[index] = raw

        async def from_key(index: int) -> None:
            raws[index] = await handles[index]._run(handles[index]._wait(timeout))

        await asyncio.gather(*(from_inbox(k, i) for k, i in groups.items()),
                             *(from_key(i) for i in alone))
        return results_in_order([h.id for h in handles], raws, self.options, timeout)

    async def aclose(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        await asyncio.gather(*self._refreshing.values(), return_exceptions=True)
        for box in self._inboxes.values():
            await box.close()
        await self.redis.aclose()
        pool = getattr(self.redis, "connection_pool", None)  # a cluster client has one per node
        if pool is not None:
            await pool.disconnect()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
