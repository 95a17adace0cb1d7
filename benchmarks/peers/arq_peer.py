"""arq, with its defaults and tuned (``ARQ_TUNED``)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import redis

from benchmarks import peers
from benchmarks.peers.peer import POLL_S, JobCounts, Peer, gathered

#: arq tuned for throughput: 100 jobs in flight, polling every 10 ms.
ARQ_TUNED = {"max_jobs": 100, "poll_delay": 0.01}


class Arq(Peer):
    library = "arq"

    def __init__(self, name: str, tuned: bool) -> None:
        self.tuned = ARQ_TUNED if tuned else {"max_jobs": peers.ARQ_DEFAULT_MAX_JOBS,
                                              "poll_delay": peers.ARQ_DEFAULT_POLL_DELAY}
        super().__init__(name, f"arq, {'tuned' if tuned else 'defaults'} (max_jobs "
                               f"{self.tuned['max_jobs']}, poll_delay "
                               f"{self.tuned['poll_delay']} s)")

    def jobs(self, cfg: JobCounts) -> int:
        # arq's defaults poll every 0.5 s with 10 jobs in flight: a quarter keeps the pass short.
        return cfg.arq_jobs if self.tuned == ARQ_TUNED else max(100, cfg.arq_jobs // 4)

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "arq", "benchmarks.peers.ArqSettings"], {
            peers.URL_ENV: db_url, peers.ARQ_MAX_JOBS_ENV: str(self.tuned["max_jobs"]),
            peers.ARQ_POLL_DELAY_ENV: str(self.tuned["poll_delay"])}

    def ready(self, client: redis.Redis) -> bool:
        from arq.constants import default_queue_name, health_check_key_suffix

        return bool(client.exists(default_queue_name + health_check_key_suffix))

    async def open(self, db_url: str) -> None:
        from arq.connections import RedisSettings, create_pool

        await super().open(db_url)
        self.pool = await create_pool(RedisSettings.from_dsn(db_url))

    async def close(self) -> None:
        await self.pool.aclose()

    async def add(self, n: int) -> list[Any]:
        return await gathered(n, lambda i: self.pool.enqueue_job("anoop", i))

    async def remaining(self, n: int) -> int:
        from arq.constants import default_queue_name

        return int(await self.pool.zcard(default_queue_name))

    async def times(self, handles: list[Any]) -> list[tuple[float, float, bool]]:
        while None in (infos := [await j.result_info() for j in handles]):
            await asyncio.sleep(POLL_S)
        return [(i.start_time.timestamp(), i.finish_time.timestamp(), i.success)
                for i in infos]
