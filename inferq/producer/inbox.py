"""Many awaited results over one connection.

An ``AsyncClient`` names a reply inbox in each request it enqueues; whoever writes the result
(worker, dead-lettering, cancellation) also pushes ``<id> <result>`` onto that inbox in the
same atomic script. One listener per queue blocks on the inbox with ``BLMPOP`` and resolves the
waiting futures with the results it popped, so ten thousand awaited results cost one
connection and no read each. The listener runs only while someone waits.

Results popped before anyone waits for them (``enqueue_many`` of many requests, then awaiting
them) are kept for a later waiter up to ``ARRIVED_BYTES``; beyond that only their ids are
kept, and such a waiter reads its result from its key.

The synchronous ``Client`` does the same with a listener thread (``SyncResultInbox``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from inferq.protocol.keys import QueueKeys

log = logging.getLogger("inferq.producer")

BLOCK_S = 1.0
BATCH = 512
#: Also check waiters directly after a connection error and every RESYNC_S while some wait: a
#: BLMPOP whose reply was lost with its connection (a server restart) popped ids that no one
#: will push again, and those results must still reach their waiters.
RESYNC_S = 5.0
ARRIVED_CAP = 100_000
ARRIVED_BYTES = 64 * 2**20


class ResultInbox:
    def __init__(self, client: aioredis.Redis, keys: QueueKeys, client_id: str) -> None:
        self._client = client
        self._keys = keys
        self._key = keys.inbox(client_id)
        self._waiters: dict[str, list[asyncio.Future[bytes]]] = {}
        self._since: dict[str, float] = {}
        #: Ids already popped from the inbox (delivered, or popped before anyone waited):
        #: a waiter that registers later takes its result from ``_kept`` or reads it.
        self._arrived: OrderedDict[str, None] = OrderedDict()
        #: Results popped before anyone waited for them, oldest first, within ARRIVED_BYTES.
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._kept_bytes = 0
        self._task: asyncio.Task[None] | None = None

    async def wait(self, request_id: str, timeout: float | None) -> bytes | None:
        """The raw result, or None when ``timeout`` passes first."""
        kept = self._kept.pop(request_id, None)
        if kept is not None:
            self._kept_bytes -= len(kept)
            return kept
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._waiters.setdefault(request_id, []).append(future)
        self._since.setdefault(request_id, loop.time())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen())
        try:
            # Registered first, then checked: an id the inbox already gave up (and whose
            # result was not kept) is read directly; any other result arrives through the
            # inbox. If Redis is unreachable right now, the listener's resync delivers it later.
            if request_id in self._arrived:
                try:
                    raw = await self._client.lindex(self._keys.result(request_id), 0)
                except RedisError as exc:
                    log.warning("result check for %s failed (%s); waiting on the inbox",
                                request_id, exc)
                    raw = None
                if raw is not None:
                    return raw.encode() if isinstance(raw, str) else bytes(raw)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            waiters = self._waiters.get(request_id, [])
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop(request_id, None)
                self._since.pop(request_id, None)

    async def _listen(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + RESYNC_S
        while self._waiters:
            try:
                if failures or loop.time() >= next_resync:
                    # Safety net for ids lost in transit (a reply lost with its connection,
                    # an inbox trimmed at its cap): waiters older than RESYNC_S read directly.
                    cutoff = loop.time() - (0 if failures else RESYNC_S)
                    await self._resolve([i for i, t in self._since.items() if t <= cutoff])
                    next_resync = loop.time() + RESYNC_S
                await self._deliver_once()
                failures = 0
            except RedisError as exc:
                failures += 1
                if failures == 1:
                    log.warning("result inbox %s: %s; retrying with backoff", self._key, exc)
                await asyncio.sleep(min(BLOCK_S * 2 ** (failures - 1) / 8, 5.0))

    async def _deliver_once(self) -> None:
        reply = await self._client.blmpop(BLOCK_S, 1, self._key, direction="LEFT", count=BATCH)
        if not reply:
            return
        bare: list[str] = []
        for entry in reply[1]:
            raw = entry if isinstance(entry, bytes) else str(entry).encode()
            head, _, body = raw.partition(b" ")
            request_id = head.decode()
            self._arrived[request_id] = None
            waiters = self._waiters.get(request_id)
            if not body:
                # An id alone (pushed by an older version of the scripts): read the result.
                if waiters:
                    bare.append(request_id)
            elif waiters:
                for future in waiters:
                    if not future.done():
                        future.set_result(body)
            else:
                self._keep(request_id, body)
        while len(self._arrived) > ARRIVED_CAP:
            self._arrived.popitem(last=False)
        await self._resolve(bare)

    def _keep(self, request_id: str, body: bytes) -> None:
        previous = self._kept.pop(request_id, None)
        if previous is not None:
            self._kept_bytes -= len(previous)
        self._kept[request_id] = body
        self._kept_bytes += len(body)
        while self._kept_bytes > ARRIVED_BYTES and self._kept:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped)

    async def _resolve(self, wanted: list[str]) -> None:
        """Read the results of these waiters' requests and wake the ones that have one."""
        if not wanted:
            return
        pipe = self._client.pipeline(transaction=False)
        for request_id in wanted:
            pipe.lindex(self._keys.result(request_id), 0)
        for request_id, raw in zip(wanted, await pipe.execute(), strict=True):
            for future in self._waiters.get(request_id, []):
                if raw is not None and not future.done():
                    future.set_result(bytes(raw))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None


class SyncResultInbox:
    """``ResultInbox`` for the synchronous ``Client``: one listener thread per queue blocks on
    the client's inbox with ``BLMPOP`` and hands each result to the threads waiting for it, so
    thousands of threads can wait on one ``Client`` over one connection (plus the pool's
    connections for short calls). The thread runs only while someone waits. Results popped
    before their waiter arrived are kept within the same bounds (``ARRIVED_BYTES``,
    ``ARRIVED_CAP``) and with the same resync safety net as ``ResultInbox``."""

    def __init__(self, client: redis.Redis, keys: QueueKeys, client_id: str) -> None:
        self._client = client
        self._keys = keys
        self._key = keys.inbox(client_id)
        self._lock = threading.Lock()
        self._waiters: dict[str, list[_Slot]] = {}
        self._since: dict[str, float] = {}
        self._arrived: OrderedDict[str, None] = OrderedDict()
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._kept_bytes = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def wait(self, request_id: str, timeout: float | None) -> bytes | None:
        """The raw result, or None when ``timeout`` passes first."""
        slot = _Slot()
        with self._lock:
            kept = self._kept.pop(request_id, None)
            if kept is not None:
                self._kept_bytes -= len(kept)
                return kept
            self._waiters.setdefault(request_id, []).append(slot)
            self._since.setdefault(request_id, time.monotonic())
            arrived = request_id in self._arrived
            # (A listener that is not alive: this process is a fork of the one that ran it.)
            if (self._thread is None or not self._thread.is_alive()) and not self._closed:
                self._thread = threading.Thread(target=self._listen, daemon=True,
                                                name=f"inferq-inbox-{self._keys.queue}")
                self._thread.start()
        try:
            if arrived:  # popped earlier and not kept: read it from its key
                try:
                    raw = self._client.lindex(self._keys.result(request_id), 0)
                except RedisError as exc:
                    log.warning("result check for %s failed (%s); waiting on the inbox",
                                request_id, exc)
                    raw = None
                if raw is not None:
                    return raw.encode() if isinstance(raw, str) else bytes(raw)
            return slot.get(timeout)
        finally:
            with self._lock:
                waiters = self._waiters.get(request_id, [])
                if slot in waiters:
                    waiters.remove(slot)
                if not waiters:
                    self._waiters.pop(request_id, None)
                    self._since.pop(request_id, None)

    def _listen(self) -> None:
        failures = 0
        next_resync = time.monotonic() + RESYNC_S
        while True:
            with self._lock:
                if not self._waiters or self._closed:
                    self._thread = None  # a waiter that registers next starts a new one
                    return
                stale: list[str] = []
                if failures or time.monotonic() >= next_resync:
                    cutoff = time.monotonic() - (0 if failures else RESYNC_S)
                    stale = [i for i, t in self._since.items() if t <= cutoff]
            try:
                if stale:
                    self._resolve(stale)
                    next_resync = time.monotonic() + RESYNC_S
                self._deliver_once()
                failures = 0
            except RedisError as exc:
                failures += 1
                if failures == 1:
                    log.warning("result inbox %s: %s; retrying with backoff", self._key, exc)
                time.sleep(min(BLOCK_S * 2 ** (failures - 1) / 8, 5.0))
            except Exception:
                log.exception("result inbox %s: unexpected error", self._key)
                failures += 1
                time.sleep(min(BLOCK_S * 2 ** (failures - 1) / 8, 5.0))

    def _deliver_once(self) -> None:
        reply = self._client.blmpop(BLOCK_S, 1, self._key, direction="LEFT", count=BATCH)
        if not reply:
            return
        bare: list[str] = []
        with self._lock:
            for entry in reply[1]:
                raw = entry if isinstance(entry, bytes) else str(entry).encode()
                head, _, body = raw.partition(b" ")
                request_id = head.decode()
                self._arrived[request_id] = None
                waiters = self._waiters.get(request_id)
                if not body:
                    if waiters:
                        bare.append(request_id)
                elif waiters:
                    for slot in waiters:
                        slot.put(body)
                else:
                    self._keep(request_id, body)
            while len(self._arrived) > ARRIVED_CAP:
                self._arrived.popitem(last=False)
        self._resolve(bare)

    def _keep(self, request_id: str, body: bytes) -> None:
        previous = self._kept.pop(request_id, None)
        if previous is not None:
            self._kept_bytes -= len(previous)
        self._kept[request_id] = body
        self._kept_bytes += len(body)
        while self._kept_bytes > ARRIVED_BYTES and self._kept:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped)

    def _resolve(self, wanted: list[str]) -> None:
        if not wanted:
            return
        pipe = self._client.pipeline(transaction=False)
        for request_id in wanted:
            pipe.lindex(self._keys.result(request_id), 0)
        replies = pipe.execute()
        with self._lock:
            for request_id, raw in zip(wanted, replies, strict=True):
                if raw is not None:
                    for slot in self._waiters.get(request_id, []):
                        slot.put(bytes(raw))

    def close(self) -> None:
        """Stop the listener (within one ``BLOCK_S``); waiting threads time out as asked."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=BLOCK_S * 5)


class _Slot:
    """One waiting thread's mailbox: the first result put wins."""

    __slots__ = ("_event", "_value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: bytes | None = None

    def put(self, value: bytes) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def get(self, timeout: float | None) -> bytes | None:
        self._event.wait(timeout)
        return self._value
