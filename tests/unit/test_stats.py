"""Queue statistics: one description of the reads, run by a sync and an asyncio client."""

from __future__ import annotations

import fakeredis

from inferq.plans import run, run_async
from inferq.protocol import scores
from inferq.protocol.keys import QueueKeys
from inferq.stats import live_workers, queue_stats

KEYS = QueueKeys.for_model("embed", "m")


async def test_sync_and_async_clients_read_the_same_stats() -> None:
    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server)
    seconds, _ = sync.time()
    now_ms = int(seconds) * 1000
    sync.zadd(KEYS.pending, {f"p{p}-{i}": scores.band(p) + i
                             for p, n in ((9, 2), (0, 1), (-5, 3)) for i in range(n)})
    sync.zadd(KEYS.inflight, {"r": now_ms + 1000})
    sync.zadd(KEYS.dead, {"d": 1})
    sync.zadd(KEYS.workers, {"live": now_ms + 30_000, "lapsed": now_ms - 1000})
    sync.hset(KEYS.stats, mapping={"ok": 4, "failed": 1})
    sync.hset(KEYS.window("live"), mapping={"window_ms": "2.5", "reasons": '{"full": 3}'})

    stats = run(sync, queue_stats(KEYS))
    assert stats.pending_by_priority == {9: 2, 0: 1, -5: 3} and stats.pending == 6
    assert (stats.inflight, stats.dead_lettered, stats.live_workers) == (1, 1, ["live"])
    assert stats.counters == {"ok": 4, "failed": 1}
    assert stats.windows == {"live": {"window_ms": 2.5, "reasons": {"full": 3}}}  # numbers
    aio = fakeredis.FakeAsyncRedis(server=server)
    assert await run_async(aio, queue_stats(KEYS)) == stats
    gauges = await run_async(aio, queue_stats(KEYS, detail=False))
    assert (gauges.pending_by_priority, gauges.live_workers) == (stats.pending_by_priority,
                                                                ["live"])
    assert await run_async(aio, live_workers(KEYS)) == run(sync, live_workers(KEYS)) == ["live"]
