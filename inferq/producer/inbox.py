"""Many awaited results over one connection.

A client names a reply inbox in each request it enqueues; whoever writes the result (worker,
dead-lettering, cancellation) also pushes ``<id> <result>`` onto that inbox in the same atomic
script. One listener per queue blocks on the inbox with ``BLMPOP`` and hands the results it
popped to their waiters, so ten thousand awaited results cost one connection and no read
each. The listener runs only while someone waits.

Results popped before anyone waits for them (``enqueue_many`` of many requests, then awaiting
them) are kept for a later waiter up to ``ARRIVED_BYTES``; beyond that only their ids are
kept, and such a waiter reads its result from its key. A safety net reads the result keys of
waiters older than ``RESYNC_S`` directly, and of all waiters after a connection error: a
``BLMPOP`` whose reply was lost with its connection popped ids that no one pushes again.

The rules live once, without I/O, in ``InboxBook`` (who waits for what, what arrived, what is
kept, whether a listener runs; thread-safe) and its plans (``listen``, ``read``): the
``AsyncClient``'s ``ResultInbox`` runs them on an asyncio task and hands results to futures,
the synchronous ``Client``'s ``SyncResultInbox`` on a thread and hands them to waiting
threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from redis.exceptions import RedisError

from inferq import plans
from inferq.plans import Direct, Plan, Sleep, call
from inferq.protocol.keys import QueueKeys

log = logging.getLogger("inferq.producer")

BLOCK_S = 1.0
BATCH = 512
#: Waiters older than this read their result key directly (see the module docstring).
RESYNC_S = 5.0
ARRIVED_CAP = 100_000
ARRIVED_BYTES = 64 * 2**20



class Waiter(Protocol):
    """Whoever waits for one result: an ``asyncio.Future`` or a thread's ``_Slot``. The first
    result handed wins."""

    def done(self) -> bool: ...

    def set_result(self, result: bytes, /) -> None: ...


def _bytes(raw: Any) -> bytes:
    return raw.encode() if isinstance(raw, str) else bytes(raw)


class InboxBook:
    """One inbox's state and rules, without I/O; every method is thread-safe."""

    def __init__(self, keys: QueueKeys, client_id: str) -> None:
        self.keys = keys
        self.key = keys.inbox(client_id)
        self._lock = threading.Lock()
        self._waiters: dict[str, list[Waiter]] = {}
        self._since: dict[str, float] = {}
        #: Ids already popped from the inbox (delivered, or popped before anyone waited):
        #: a waiter that registers later takes its result from ``_kept`` or reads it.
        self._arrived: OrderedDict[str, None] = OrderedDict()
        #: Results popped before anyone waited for them, oldest first, within ARRIVED_BYTES.
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._kept_bytes = 0
        #: A listener runs (or was asked to start); ``closed``: none may start again.
        self.listening = False
        self.closed = False

    def enter(self, request_id: str, waiter: Waiter) -> tuple[bytes | None, bool, bool]:
        """A waiter for ``request_id``: (its result if one was kept for it, whether the
        caller must start a listener, whether its id was popped before: then the caller reads
        its result key, ``read``)."""
        with self._lock:
            kept = self._kept.pop(request_id, None)
            if kept is not None:
                self._kept_bytes -= len(kept)
                return kept, False, False
            self._waiters.setdefault(request_id, []).append(waiter)
            self._since.setdefault(request_id, time.monotonic())
            start = not self.listening and not self.closed
            self.listening = self.listening or start
            return None, start, request_id in self._arrived

    def leave(self, request_id: str, waiter: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(request_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(request_id, None)
                self._since.pop(request_id, None)

    def keep_listening(self) -> bool:
        """Whether the listener goes on (someone waits); when not, it is no longer running
        for the next ``enter``, in the same step."""
        with self._lock:
            if self._waiters and not self.closed:
                return True
            self.listening = False
            return False

    def waiting_since(self, cutoff: float) -> list[str]:
        with self._lock:
            return [i for i, t in self._since.items() if t <= cutoff]

    def popped(self, reply: Any) -> list[str]:
        """Hand out what one BLMPOP popped; the ids whose waiters must read their key (an id
        pushed without its result)."""
        if not reply:
            return []
        bare: list[str] = []
        with self._lock:
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
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(body)
                else:
                    self._keep(request_id, body)
            while len(self._arrived) > ARRIVED_CAP:
                self._arrived.popitem(last=False)
        return bare

    def _keep(self, request_id: str, body: bytes) -> None:
        previous = self._kept.pop(request_id, None)
        if previous is not None:
            self._kept_bytes -= len(previous)
        self._kept[request_id] = body
        self._kept_bytes += len(body)
        while self._kept_bytes > ARRIVED_BYTES and self._kept:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped)

    def _found(self, wanted: Sequence[str], raws: Sequence[Any]) -> None:
        with self._lock:
            for request_id, raw in zip(wanted, raws, strict=True):
                if raw is not None:
                    for waiter in self._waiters.get(request_id, []):
                        if not waiter.done():
                            waiter.set_result(_bytes(raw))

    # ---------------------------------------------------------------------------- plans

    def resolve(self, wanted: Sequence[str]) -> Plan[None]:
        """Read the result keys of these waiters' requests and hand out the results found."""
        if wanted:
            self._found(wanted, (yield [call("lindex", self.keys.result(i), 0) for i in wanted]))

    def read(self, request_id: str) -> Plan[bytes | None]:
        """One result from its key (None if absent or Redis fails: the waiter then waits on
        the inbox, and the listener's resync delivers it later)."""
        try:
            raw = yield Direct(call("lindex", self.keys.result(request_id), 0))
        except RedisError as exc:
            log.warning("result check for %s failed (%s); waiting on the inbox", request_id, exc)
            return None
        return None if raw is None else _bytes(raw)

    def listen(self) -> Plan[None]:
        """The listener: BLMPOP and hand out, until no one waits; Redis errors are retried
        with backoff, and followed by a resync of every waiter."""
        failures = 0
        next_resync = time.monotonic() + RESYNC_S
        while self.keep_listening():
            try:
                if failures or time.monotonic() >= next_resync:
                    cutoff = time.monotonic() - (0 if failures else RESYNC_S)
                    yield from self.resolve(self.waiting_since(cutoff))
                    next_resync = time.monotonic() + RESYNC_S
                reply = yield Direct(call("blmpop", BLOCK_S, 1, self.key, direction="LEFT",
                                          count=BATCH))
                yield from self.resolve(self.popped(reply))
                failures = 0
            except Exception as exc:
                failures += 1
                if not isinstance(exc, RedisError):
                    log.exception("result inbox %s: unexpected error", self.key)
                elif failures == 1:
                    log.warning("result inbox %s: %s; retrying with backoff", self.key, exc)
                yield Sleep(min(BLOCK_S * 2 ** (failures - 1) / 8, 5.0))


class ResultInbox:
    """The ``AsyncClient``'s inbox of one queue: its listener is an asyncio task."""

    def __init__(self, client: Any, keys: QueueKeys, client_id: str) -> None:
        self._client = client
        self._book = InboxBook(keys, client_id)
        self._task: asyncio.Task[None] | None = None

    async def wait(self, request_id: str, timeout: float | None) -> bytes | None:
        """The raw result, or None when ``timeout`` passes first."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        kept, start, arrived = self._book.enter(request_id, future)
        if kept is not None:
            return kept
        if start or self._task is None or self._task.done():
            self._task = asyncio.create_task(plans.run_async(self._client, self._book.listen()))
        try:
            # Registered first, then read: an id popped before (whose result was not kept)
            # is read from its key; any other result arrives through the inbox.
            if arrived and (raw := await plans.run_async(
                    self._client, self._book.read(request_id))) is not None:
                return raw
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            self._book.leave(request_id, future)

    async def wait_many(self, request_ids: Sequence[str], timeout: float | None
                        ) -> list[bytes | None]:
        """``wait`` for many results at once: one future for all of them, not one each (the
        raw results in order, None for those ``timeout`` left missing)."""
        loop = asyncio.get_running_loop()
        group = _Group(len(request_ids), loop.create_future())
        slots = [_GroupSlot(group) for _ in request_ids]
        ids_to_read: list[str] = []
        start_listener = False
        for request_id, slot in zip(request_ids, slots, strict=True):
            kept, start, arrived = self._book.enter(request_id, slot)
            start_listener = start_listener or start
            if kept is not None:
                slot.set_result(kept)
            elif arrived:
                ids_to_read.append(request_id)
        try:
            if start_listener or self._task is None or self._task.done():
                self._task = asyncio.create_task(
                    plans.run_async(self._client, self._book.listen()))
            if ids_to_read:  # popped before, results not kept: read from their keys
                try:
                    await plans.run_async(self._client, self._book.resolve(ids_to_read))
                except RedisError as exc:  # the listener's resync reads them later
                    log.warning("result check of %d requests failed (%s); waiting on the "
                                "inbox", len(ids_to_read), exc)
            if group.left:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(group.future), timeout)
            return [slot.value for slot in slots]
        finally:
            for request_id, slot in zip(request_ids, slots, strict=True):
                self._book.leave(request_id, slot)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        self._book.listening = False  # a later wait starts a listener again


class SyncResultInbox:
    """The synchronous ``Client``'s inbox of one queue: its listener is a thread that hands
    each result to the threads waiting for it, so thousands of threads can wait on one
    ``Client`` over one connection (plus the pool's connections for short calls)."""

    def __init__(self, client: Any, keys: QueueKeys, client_id: str) -> None:
        self._client = client
        self._book = InboxBook(keys, client_id)
        self._thread: threading.Thread | None = None

    def wait(self, request_id: str, timeout: float | None) -> bytes | None:
        """The raw result, or None when ``timeout`` passes first."""
        slot = _Slot()
        kept, start, arrived = self._book.enter(request_id, slot)
        if kept is not None:
            return kept
        # (A listener that is not alive although one should run: this process is a fork of
        # the one that ran it.)
        thread = self._thread
        if start or (thread is not None and not thread.is_alive() and not self._book.closed):
            self._thread = threading.Thread(
                target=plans.run, args=(self._client, self._book.listen()), daemon=True,
                name=f"inferq-inbox-{self._book.keys.queue}")
            self._thread.start()
        try:
            if arrived and (raw := plans.run(self._client,
                                             self._book.read(request_id))) is not None:
                return raw
            return slot.get(timeout)
        finally:
            self._book.leave(request_id, slot)

    def close(self) -> None:
        """Stop the listener (within one ``BLOCK_S``); waiting threads time out as asked."""
        self._book.closed = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=BLOCK_S * 5)


class _Group:
    """Many results awaited together (``ResultInbox.wait_many``): one future, set when the
    last of them arrives."""

    __slots__ = ("future", "left")

    def __init__(self, n: int, future: asyncio.Future[None]) -> None:
        self.left = n
        self.future = future
        if not n:
            future.set_result(None)

    def arrived(self) -> None:
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result(None)


class _GroupSlot:
    """One result of a ``_Group`` (a ``Waiter``; set on the event loop's thread)."""

    __slots__ = ("group", "value")

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.value: bytes | None = None

    def done(self) -> bool:
        return self.value is not None

    def set_result(self, value: bytes, /) -> None:
        if self.value is None:
            self.value = value
            self.group.arrived()


class _Slot:
    """One waiting thread's mailbox (a ``Waiter``): the first result set wins."""

    __slots__ = ("_event", "_value")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: bytes | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, value: bytes, /) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def get(self, timeout: float | None) -> bytes | None:
        self._event.wait(timeout)
        return self._value
