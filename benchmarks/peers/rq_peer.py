"""rq, its standard forking worker and its ``SimpleWorker``."""

from __future__ import annotations

import sys
from typing import Any

import redis

from benchmarks import peers
from benchmarks.peers.peer import JobCounts, Peer, utc_seconds


class Rq(Peer):
    library, db, poll = "rq", 2, {"zcard": 2}

    def __init__(self, name: str, simple: bool) -> None:
        self.simple = simple
        super().__init__(name, "rq, `rq worker -w rq.worker.SimpleWorker` (no fork)" if simple
                         else "rq, standard `rq worker` (forks a work horse per job)")

    def jobs(self, cfg: JobCounts) -> int:
        return cfg.rq_jobs if self.simple else cfg.rq_fork_jobs

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "rq.cli", "worker", "--url", db_url, "--quiet", "--name",
                f"bench-{self.name}", f"bench-{self.name}",
                *(["--worker-class", "rq.worker.SimpleWorker"] if self.simple else [])], {}

    def ready(self, client: redis.Redis) -> bool:
        return bool(client.scard("rq:workers"))

    def _done(self) -> int:
        return int(self.queue.finished_job_registry.get_job_count(cleanup=False)
                   + self.queue.failed_job_registry.get_job_count(cleanup=False))

    async def open(self, db_url: str) -> None:
        from rq import Queue

        await super().open(db_url)
        self.client = redis.Redis.from_url(db_url)
        self.queue = Queue(f"bench-{self.name}", connection=self.client)
        self.done_before = self._done()

    async def close(self) -> None:
        self.client.close()

    async def add(self, n: int) -> list[Any]:
        from rq import Queue

        return list(self.queue.enqueue_many(
            [Queue.prepare_data(peers.noop, (i,), result_ttl=3600) for i in range(n)]))

    async def remaining(self, n: int) -> int:
        return max(0, n - (self._done() - self.done_before))

    async def times(self, handles: list[Any]) -> list[tuple[float, float, bool]]:
        from rq.job import Job

        jobs = Job.fetch_many([j.id for j in handles], connection=self.client)
        return [(utc_seconds(j.started_at), utc_seconds(j.ended_at),
                 j.get_status(refresh=False) == "finished")
                for j in jobs if j is not None and j.started_at and j.ended_at]
