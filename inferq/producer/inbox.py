"""Many awaited results over one connection.

An ``AsyncClient`` names a reply inbox in each request it enqueues; whoever writes the result
(worker, dead-lettering, cancellation) also pushes the request id onto that inbox in the same
atomic script. One listener per queue blocks on the inbox with ``BLMPOP`` and resolves the
waiting futures, so ten thousand awaited results cost one connection, not ten thousand
blocking ones. The listener runs only while someone waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

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


class ResultInbox:
    def __init__(self, client: aioredis.Redis, keys: QueueKeys, client_id: str) -> None:
        self._client = client
        self._keys = keys
        self._key = keys.inbox(client_id)
        self._waiters: dict[str, list[asyncio.Future[bytes]]] = {}
        self._since: dict[str, float] = {}
        #: Ids already popped from the inbox (delivered, or popped before anyone waited):
        #: a waiter that registers later reads its result directly.
        self._arrived: OrderedDict[str, None] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, request_id: str, timeout: float | None) -> bytes | None:
        """The raw result, or None when ``timeout`` passes first."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._waiters.setdefault(request_id, []).append(future)
        self._since.setdefault(request_id, loop.time())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._listen())
        try:
            # Registered first, then checked: an id the inbox already gave up is read
            # directly; any other result arrives through the inbox (no read per waiter). If
            # Redis is unreachable right now, the listener's resync delivers it later.
            if request_id in self._arrived:
                try:
                    raw = await self._client.lindex(self._keys.result(request_id), 0)
                except RedisError as exc:
                    log.warning("result check for %s failed (%s); waiting on the inbox",
                                request_id, exc)
                    raw = None
                if raw is not None:
                    return raw.encode() if isinstance(raw, str) else bytes(raw)
            return await asyncio.wait_for(asyncio.shield(future), timeout)
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
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in reply[1]]
        for request_id in ids:
            self._arrived[request_id] = None
        while len(self._arrived) > ARRIVED_CAP:
            self._arrived.popitem(last=False)
        await self._resolve([i for i in ids if i in self._waiters])

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
