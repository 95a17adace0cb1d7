"""The gateway's open streams: one reader that multiplexes every stream's ``XREAD``, and the
caps on how many may be open.

Why a multiplexer. A stream that follows its generation with its own ``XREAD BLOCK`` holds a
Redis connection for as long as it blocks; on the pool every route shares, a few hundred open
streams (each idle, waiting for a queued request) held every connection, and a plain
``GET /v1/requests/{id}`` queued behind them for seconds. A separate pool with one connection
per stream would fix the starvation but costs a connection, a task's round trip and a result
check per stream every ``BLOCK_MS``. Instead, as a serving engineer multiplexes sockets with
``epoll``, this gateway runs one reader per stream group (all streams on a single Redis; one
group per hash tag on a Redis Cluster, where the keys of one ``XREAD`` must share a slot), on
its own connection, outside the shared pool. Each turn it sends one ``XREAD BLOCK`` naming
every open stream (one key per request, read from the earliest position any of its readers
needs), hands each reader the entries after its own position, and checks in one pipelined
round trip the results of the streams that ended or stayed quiet for ``BLOCK_MS`` (a request
cancelled before it ran has no end marker). 400 open streams cost one connection and about
eight commands a second, not 400 connections and 3,200 commands.

A stream that opens while the reader is blocked must not wait out the block (its first token
would be late): on a single Redis the newcomer sends ``CLIENT UNBLOCK`` for the reader's
connection (an instant command), and the reader goes round again with the new key. On a
Redis Cluster there is no such wake-up; a new stream's first read waits for the current
block to end (at most ``BLOCK_MS``).

Caps. ``max_streams`` streams may be open on one gateway and ``max_streams_per_tenant`` per
tenant (every caller without a tenant, the operator, counts as one tenant); beyond either,
a new stream is refused with 429 and ``Retry-After`` before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from inferq import connection
from inferq.connection import ConnectionSettings, wrap_connection_errors
from inferq.errors import ResultTimeout
from inferq.openai.errors import ApiError
from inferq.producer.options import ClientOptions
from inferq.producer.replies import parse_result
from inferq.producer.streaming import BLOCK_MS, READ_COUNT, StreamEntry, StreamReader
from inferq.producer.waits import block_timeout
from inferq.protocol.codec import Result
from inferq.protocol.keys import QueueKeys
from inferq.protocol.ops import as_str

log = logging.getLogger("inferq.gateway")

_TAG = re.compile(r"\{[^}]*\}")
#: The most entries one stream's reader is handed from its final read (after the result).
TAIL_COUNT = 1 << 16


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id, ordered as Redis orders them."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class _Follower:
    """One open stream: its position (``reader``) and what the multiplexer hands it."""

    key: str
    result_key: str
    reader: StreamReader
    inbox: asyncio.Queue[list[Any] | bytes | BaseException] = field(
        default_factory=asyncio.Queue)
    checked_at: float = field(default_factory=time.monotonic)
    done: bool = False
    #: Whether any entry (a token, with or without text) has been handed over yet.
    started: bool = False


class _Group:
    """The streams that one ``XREAD`` can name together, and the task that reads them."""

    def __init__(self, mux: StreamMux, redis: Any) -> None:
        self.mux = mux
        self.redis = redis
        self.followers: set[_Follower] = set()
        self.task: asyncio.Task[None] | None = None
        #: The reader's connection id (for ``CLIENT UNBLOCK``), the keys its current read
        #: names, and whether a wake-up is already on its way.
        self.client_id: int | None = None
        self.reading: frozenset[str] | None = None
        self.waking = False

    def add(self, follower: _Follower) -> None:
        self.followers.add(follower)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.run(), name="inferq-stream-reader")
        elif self.reading is not None and follower.key not in self.reading:
            self.wake()

    def remove(self, follower: _Follower) -> None:
        follower.done = True
        self.followers.discard(follower)

    def wake(self) -> None:
        if self.waking or self.client_id is None or self.mux.unblocker is None:
            return
        self.waking = True
        client_id, unblocker = self.client_id, self.mux.unblocker

        async def unblock() -> None:
            try:
                if not await unblocker.client_unblock(client_id):
                    self.client_id = None  # reconnected since: ask its id again
            except RedisError as exc:  # the newcomer waits for the block to end instead
                log.debug("stream reader wake-up failed: %s", exc)
            finally:
                self.waking = False

        self.mux.spawn(unblock())

    async def run(self) -> None:
        try:
            while self.followers:
                await self.turn()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # Redis down, or a bug: every stream of the group ends
            self.client_id = None  # a new connection next time
            if not isinstance(exc, RedisError):
                log.exception("stream reader failed")
            for follower in list(self.followers):
                follower.inbox.put_nowait(exc)
                self.remove(follower)
        finally:
            self.reading = None

    async def turn(self) -> None:
        """One ``XREAD`` of every followed stream, then the result checks that are due."""
        if self.client_id is None and self.mux.unblocker is not None:
            self.client_id = int(await self.redis.client_id())
        positions: dict[str, str] = {}
        for f in self.followers:
            at = positions.get(f.key)
            if at is None or entry_key(f.reader.last_id) < entry_key(at):
                positions[f.key] = f.reader.last_id
        self.reading = frozenset(positions)
        try:
            reply = await self.redis.xread(positions, count=READ_COUNT, block=BLOCK_MS)
        finally:
            self.reading = None
        rows = _by_key(reply)
        now = time.monotonic()
        due: list[_Follower] = []
        for f in list(self.followers):
            got = [r for r in rows.get(f.key, ()) if entry_key(r[0]) > entry_key(
                f.reader.last_id)]
            if got:
                entries = f.reader.feed_entries([(f.key, got)])
                # The first entry goes over even without text (tokens whose text is held
                # back, or decodes to nothing): the stream has started (``STARTED``).
                if entries or not f.started:
                    f.started = True
                    f.inbox.put_nowait(entries)
            if f.reader.ended or (not got and now - f.checked_at >= BLOCK_MS / 1e3):
                due.append(f)
        if due:
            result_keys = sorted({f.result_key for f in due})
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in result_keys:
                    pipe.lindex(key, 0)
                raws = dict(zip(result_keys, await pipe.execute(), strict=True))
            now = time.monotonic()
            for f in due:
                f.checked_at = now
                raw = raws[f.result_key]
                if raw is not None and not f.done:
                    f.inbox.put_nowait(raw if isinstance(raw, bytes) else as_str(raw).encode())
                    self.remove(f)


def _by_key(reply: Any) -> dict[str, list[tuple[str, Any]]]:
    """An ``XREAD`` reply (RESP2 list or RESP3 mapping) as key -> [(entry id, fields)]."""
    if not reply:
        return {}
    pairs = reply.items() if isinstance(reply, dict) else reply
    return {as_str(key): [(as_str(entry_id), fields) for entry_id, fields in rows]
            for key, rows in pairs}


class Started:
    """What ``follow(..., announce_start=True)`` yields once, at the stream's first entry: the
    generation produced its first token, whether or not that token showed text yet."""


STARTED = Started()


class StreamMux:
    """Every open stream of one gateway, read by one reader per stream group (see the module
    docstring); ``follow`` is ``AsyncHandle.stream_entries`` without a connection per stream."""

    def __init__(self, settings: ConnectionSettings, options: ClientOptions,
                 unblocker: Any) -> None:
        self.options = options
        self.cluster = connection.is_cluster(settings)
        self.settings = settings
        #: Where the final read and the wake-ups go: instant commands, on the shared pool.
        self.shared = unblocker
        self.unblocker = None if self.cluster else unblocker
        self._groups: dict[str, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _group(self, key: str) -> _Group:
        tag = _TAG.search(key)
        name = tag.group() if self.cluster and tag is not None else ""
        group = self._groups.get(name)
        if group is None:
            # Its own connection, outside the shared pool: one per group, held by its reader.
            redis = (connection.async_client(self.settings) if self.cluster else
                     connection.async_client(self.settings, single_connection_client=True))
            group = self._groups[name] = _Group(self, redis)
        return group

    async def follow(self, keys: QueueKeys, request_id: str, timeout: float | None, *,
                     after: str = "0-0", reader: StreamReader | None = None,
                     announce_start: bool = False
                     ) -> AsyncIterator[StreamEntry | Result | Started]:
        """The deltas of ``request_id``'s stream after entry ``after``, then its ``Result``;
        ``ResultTimeout`` after ``timeout``. ``reader`` (made here if not given) holds the
        position: after the ``Result``, its ``last_id`` is the stream's last entry. With
        ``announce_start``, ``STARTED`` first, as soon as the stream has an entry after
        ``after`` (its first token: the text of the first tokens may be held back, e.g. an
        incomplete UTF-8 character, or be empty, e.g. special tokens)."""
        reader = reader if reader is not None else StreamReader(after)
        reader.last_id = after
        follower = _Follower(keys.stream(request_id), keys.result(request_id), reader)
        deadline = None if timeout is None else time.monotonic() + block_timeout(timeout)
        group = self._group(follower.key)
        group.add(follower)
        try:
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = await asyncio.wait_for(follower.inbox.get(), wait)
                except TimeoutError:
                    raise ResultTimeout(f"no result for request {request_id} within "
                                        f"{timeout} s") from None
                if isinstance(item, BaseException):
                    with wrap_connection_errors(self.settings):
                        raise item
                if isinstance(item, list):
                    if announce_start:
                        announce_start = False
                        yield STARTED
                    for entry in item:
                        yield entry
                    continue
                # Deltas are written before the result: take any not read yet.
                with wrap_connection_errors(self.settings):
                    tail = await self.shared.xread({follower.key: reader.last_id},
                                                   count=TAIL_COUNT)
                for entry in reader.feed_entries(tail):
                    yield entry
                result = parse_result(item, self.options)
                assert result is not None
                yield result
                return
        finally:
            group.remove(follower)

    async def last_entry(self, keys: QueueKeys, request_id: str) -> str | None:
        """The id of the last entry of ``request_id``'s stream (None: no entry)."""
        with wrap_connection_errors(self.settings):
            rows = await self.shared.xrevrange(keys.stream(request_id), count=1)
        return as_str(rows[0][0]) if rows else None

    async def aclose(self) -> None:
        for task in [*(g.task for g in self._groups.values() if g.task), *self._tasks]:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for group in self._groups.values():
            await group.redis.aclose()
        self._groups.clear()


@dataclass
class StreamSlots:
    """How many streams are open, on this gateway and per tenant; ``take`` refuses beyond
    either cap with 429 (the operator, tenant None, is one tenant)."""

    max_streams: int
    max_per_tenant: int
    retry_after_s: int
    open: int = 0
    by_tenant: dict[str | None, int] = field(default_factory=dict)

    def take(self, tenant: str | None) -> Slot:
        held = self.by_tenant.get(tenant, 0)
        if self.open >= self.max_streams or held >= self.max_per_tenant:
            which = (f"this gateway's {self.max_streams}" if self.open >= self.max_streams
                     else f"your {self.max_per_tenant}")
            raise ApiError(429, "rate_limit_error", "too_many_streams",
                           f"too many open streams: {which} are open; close one or retry "
                           "later", headers={"Retry-After": str(self.retry_after_s)})
        self.open += 1
        self.by_tenant[tenant] = held + 1
        return Slot(self, tenant)

    def give(self, tenant: str | None) -> None:
        self.open -= 1
        left = self.by_tenant[tenant] - 1
        if left:
            self.by_tenant[tenant] = left
        else:
            del self.by_tenant[tenant]


@dataclass(eq=False)
class Slot:
    """One open stream's place; ``release`` (once, idempotent) frees it."""

    slots: StreamSlots
    tenant: str | None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slots.give(self.tenant)
