"""Read a queue's state for ``inferq stats`` (read-only; no ``KEYS``, no full scans)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
import redis.asyncio as aioredis

from inferq.protocol import scores
from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys, queues_registry

THROUGHPUT_WINDOW_S = 10


@dataclass
class QueueStats:
    queue: str
    pending_by_priority: dict[int, int]
    inflight: int
    dead_lettered: int
    live_workers: list[str]
    counters: dict[str, int]
    throughput_per_s: float
    windows: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return sum(self.pending_by_priority.values())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pending"] = self.pending
        return data


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def pending_by_priority(client: redis.Redis, keys: QueueKeys) -> dict[int, int]:
    """Count per priority band: one ZCOUNT per distinct priority present, not a scan."""
    counts: dict[int, int] = {}
    low = "-inf"
    while True:
        first = client.zrangebyscore(keys.pending, low, "+inf", start=0, num=1, withscores=True)
        if not first:
            return counts
        priority, _ = scores.decode(float(first[0][1]))
        band_start = scores.band(priority)
        band_end = band_start + scores.SEQ_LIMIT
        counts[priority] = int(client.zcount(keys.pending, band_start, f"({band_end}"))
        low = str(band_end)


def read_window(client: redis.Redis, keys: QueueKeys, worker: str) -> dict[str, Any]:
    """One worker's published window and batch statistics (empty when it never published)."""
    fields: dict[str, Any] = {_s(k): _s(v) for k, v in client.hgetall(keys.window(worker)).items()}
    for name in ("reasons", "sizes"):
        if name in fields:
            fields[name] = json.loads(fields[name])
    return fields


def read_queue(client: redis.Redis, keys: QueueKeys) -> QueueStats:
    seconds, _ = client.time()
    now_ms = int(seconds) * 1000
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.inflight)
    pipe.zcard(keys.dead)
    pipe.zrangebyscore(keys.workers, now_ms, "+inf")
    pipe.hgetall(keys.stats)
    inflight, dead, workers, raw_stats = pipe.execute()
    stats = {_s(k): _s(v) for k, v in raw_stats.items()}
    counters = {k: int(v) for k, v in stats.items() if ":" not in k}
    recent = 0
    for slot in range(64):
        ts = stats.get(f"ts:{slot}")
        if ts is not None and int(seconds) - THROUGHPUT_WINDOW_S < int(ts) <= int(seconds):
            recent += int(stats.get(f"n:{slot}", "0"))
    live = sorted(_s(w) for w in workers)
    windows = {worker: w for worker in live if (w := read_window(client, keys, worker))}
    return QueueStats(
        queue=keys.queue,
        pending_by_priority=pending_by_priority(client, keys),
        inflight=int(inflight),
        dead_lettered=int(dead),
        live_workers=live,
        counters=counters,
        throughput_per_s=recent / THROUGHPUT_WINDOW_S,
        windows=windows,
    )


def known_queues(client: redis.Redis, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    return sorted(_s(q) for q in client.smembers(queues_registry(namespace)))


def read_all(client: redis.Redis, queues: list[str] | None = None,
             namespace: str = DEFAULT_NAMESPACE) -> list[QueueStats]:
    names = queues or known_queues(client, namespace)
    return [read_queue(client, QueueKeys(name, namespace)) for name in names]


@dataclass(frozen=True, slots=True)
class QueueGauges:
    pending_by_priority: dict[int, int]
    inflight: int
    dead: int
    live_workers: int


async def read_queue_gauges(client: aioredis.Redis, keys: QueueKeys) -> QueueGauges:
    """The queue-wide numbers a worker exports as metrics (asyncio; same rules as above)."""
    seconds, _ = await client.time()
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.inflight)
    pipe.zcard(keys.dead)
    pipe.zcount(keys.workers, int(seconds) * 1000, "+inf")
    inflight, dead, live = await pipe.execute()
    counts: dict[int, int] = {}
    low = "-inf"
    while True:
        first = await client.zrangebyscore(keys.pending, low, "+inf", start=0, num=1,
                                           withscores=True)
        if not first:
            break
        priority, _ = scores.decode(float(first[0][1]))
        band_end = scores.band(priority) + scores.SEQ_LIMIT
        counts[priority] = int(await client.zcount(keys.pending, scores.band(priority),
                                                   f"({band_end}"))
        low = str(band_end)
    return QueueGauges(counts, int(inflight), int(dead), int(live))
