"""BullMQ: its Python port, and on Node.js (``bullmq-node/``), on one key layout."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from benchmarks import peers
from benchmarks.harness import BenchmarkFailed, say
from benchmarks.peers.peer import Peer, peer_env

#: Jobs per ``addBulk`` call.
BULLMQ_BULK = 1000
NODE_DIR = Path(__file__).resolve().parent / "bullmq-node"


class BullMQ(Peer):
    """BullMQ's Python port; the Node.js subclass shares its key layout (``bull:bench:*``)."""

    library, db, poll = "bullmq", 3, {"zcard": 2}

    def __init__(self, name: str, label: str, pooled: bool = True) -> None:
        super().__init__(name, label)
        self.pooled = pooled

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", "import asyncio, benchmarks.peers as p; "
                "asyncio.run(p.run_bullmq())"], {
            peers.URL_ENV: db_url, peers.POOL_ENV: "1" if self.pooled else "0"}

    def _done(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        for state in ("completed", "failed"):
            pipe.zcard(f"bull:{peers.QUEUE}:{state}")
        return sum(pipe.execute())

    async def open(self, db_url: str) -> None:
        await super().open(db_url)
        self.client = redis.Redis.from_url(db_url)
        self.done_before = self._done()
        if self.library == "bullmq":  # the Python port's producer (Node has its own)
            import redis.asyncio as aioredis
            from bullmq import Queue

            self.queue = Queue(peers.QUEUE, {"connection": aioredis.Redis.from_url(
                db_url, decode_responses=True)})

    async def close(self) -> None:
        self.client.close()
        if self.library == "bullmq":
            await self.queue.close()

    async def add(self, n: int) -> list[Any]:
        added: list[Any] = []
        for start in range(0, n, BULLMQ_BULK):
            added += await self.queue.addBulk([{"name": "noop", "data": {"i": i}} for i in
                                               range(start, min(n, start + BULLMQ_BULK))])
        return [str(j.id) for j in added]

    async def remaining(self, n: int) -> int:
        return max(0, n - (self._done() - self.done_before))

    async def times(self, handles: list[Any]) -> list[tuple[float, float, bool]]:
        pipe = self.client.pipeline(transaction=False)
        for job_id in handles:
            pipe.hmget(f"bull:{peers.QUEUE}:{job_id}", "processedOn", "finishedOn",
                       "failedReason")
        return [(int(p) / 1e3, int(f) / 1e3, not reason) for p, f, reason in pipe.execute()
                if p and f]


class BullMQNode(BullMQ):
    library, db = "node", 5

    def missing(self) -> str | None:
        if not (shutil.which("node") and shutil.which("npm")):
            return "Node.js is not installed (node and npm on PATH; Node >= 20)"
        if not (NODE_DIR / "node_modules" / "bullmq").is_dir():
            say(f"installing BullMQ for Node.js: npm ci in {NODE_DIR}")
            done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                                  capture_output=True, text=True, timeout=600, check=False)
            if done.returncode:
                return f"`npm ci` in {NODE_DIR} failed: {done.stderr.strip()[-300:]}"
        return None

    def worker(self, db_url: str) -> tuple[list[str], dict[str, str]]:
        return ["node", str(NODE_DIR / "bench.mjs"), "worker"], {
            "BENCH_REDIS_URL": db_url, "BENCH_QUEUE": peers.QUEUE,
            "BENCH_CONCURRENCY": str(peers.CONCURRENCY)}

    async def enqueue(self, n: int) -> tuple[list[Any], float, float]:
        """``node bench.mjs add``: it reports its first add, its time and its CPU itself, so
        starting Node and loading BullMQ are not counted."""
        _, env = self.worker(self.db_url)
        proc = await asyncio.create_subprocess_exec(
            "node", str(NODE_DIR / "bench.mjs"), "add", str(n), str(BULLMQ_BULK),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**peer_env(), **env})
        out, err = await proc.communicate()
        if proc.returncode:
            raise BenchmarkFailed(f"{self.name}: node bench.mjs add failed: {err.decode()}")
        added = json.loads(out.decode().strip().splitlines()[-1])
        self.producer_cpu_s = added["cpu_us"] / 1e6
        return added["ids"], added["t0_ms"] / 1e3, added["enqueue_ms"] / 1e3
