"""Which models the gateway's queue serves: the queue registry (``inferq:queues``), where every
worker adds its queue (``task:model``) when it starts. A model absent from it has never been
served by any worker: the gateway answers 404 ``model_not_found`` at once instead of queueing a
request that would wait for its timeout (``INFERQ_GATEWAY_REQUIRE_SERVED_MODEL``), and
``GET /v1/models`` lists what is in it. Read at most every ``REFRESH_S`` seconds, and at once
when a name is missing (a worker may have just started)."""

from __future__ import annotations

import asyncio
import time

from inferq.producer.aio import AsyncClient

REFRESH_S = 2.0


class ServedQueues:
    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._queues: frozenset[str] = frozenset()
        self._read_at = -1e18
        self._lock = asyncio.Lock()

    async def queues(self, client: AsyncClient, *, fresh: bool = False) -> frozenset[str]:
        """The registered queues (``task:model``), cached for ``refresh_s`` unless ``fresh``."""
        async with self._lock:
            if fresh or time.monotonic() - self._read_at >= self.refresh_s:
                self._queues = await client.served_queues()
                self._read_at = time.monotonic()
            return self._queues

    async def served(self, client: AsyncClient, task: str, model: str) -> bool:
        queue = f"{task}:{model}"
        if queue in await self.queues(client):
            return True
        return queue in await self.queues(client, fresh=True)
