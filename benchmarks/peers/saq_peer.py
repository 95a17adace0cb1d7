"""SAQ."""

from __future__ import annotations

import sys
from typing import Any

from benchmarks import peers
from benchmarks.peers.peer import Peer, gathered


class Saq(Peer):
    library, db = "saq", 4

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "saq", "benchmarks.peers.saq_settings"], {
            peers.URL_ENV: db_url}

    async def open(self, db_url: str) -> None:
        from saq import Queue

        await super().open(db_url)
        self.queue = Queue.from_url(db_url, name=peers.QUEUE)
        await self.queue.connect()

    async def close(self) -> None:
        await self.queue.disconnect()

    async def add(self, n: int) -> list[Any]:
        return await gathered(n, lambda i: self.queue.enqueue("noop", i=i))

    async def remaining(self, n: int) -> int:
        return int(await self.queue.count("incomplete"))

    async def times(self, handles: list[Any]) -> list[tuple[float, float, bool]]:
        done = await self.queue.jobs([j.key for j in handles])
        return [(j.started / 1e3, j.completed / 1e3, j.status.value == "complete")
                for j in done if j is not None]
