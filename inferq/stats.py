"""A queue's state, read in one place: ``inferq stats``, the worker's queue gauges, the
gateway's ``/readyz`` and the container healthcheck all count through here (read-only; no
``KEYS``, no full scans).

Each reading is a plan (``inferq.plans``): a generator that yields the commands of one round
trip (run as one pipeline) and is sent their replies, until it returns what it read. Plans
never do I/O themselves, so one description of the reads serves both clients: ``run``
executes a plan on a ``redis.Redis``, ``run_async`` on a ``redis.asyncio.Redis``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from inferq.plans import Command, Plan, call, run
from inferq.protocol import scores, slo
from inferq.protocol.keys import (
    DEFAULT_NAMESPACE,
    TENANT_COUNT,
    QueueKeys,
    queues_registry,
    requested_registry,
)
from inferq.protocol.ops import as_str
from inferq.protocol.settings import settings_from_hash

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
    #: Shards read (a sharded queue: every shard it ever had, summed here).
    shards: int = 1
    #: Unfinished requests (waiting, running or waiting for a retry) per tenant, for the
    #: requests that name one (``inferq.protocol.fair``).
    tenants: dict[str, int] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return sum(self.pending_by_priority.values())

    @property
    def slo(self) -> tuple[int, int]:
        """(met, finished) of the requests with a latency objective that the live workers
        finished (``inferq.protocol.slo``: goodput), from what each publishes."""
        met = sum(int(w.get("slo_met", 0)) for w in self.windows.values())
        missed = sum(int(w.get("slo_missed", 0)) for w in self.windows.values())
        return met, met + missed

    @property
    def slo_ratio(self) -> list[int]:
        """The prediction's error (actual / predicted time to the result or first token) of
        the requests admission admitted, counted per ``slo.RATIO_BUCKETS`` bucket, summed over
        what the live workers publish."""
        total = [0] * (len(slo.RATIO_BUCKETS) + 1)
        for w in self.windows.values():
            for index, n in enumerate(slo.ratio_counts(w.get("slo_ratio", ""))):
                total[index] += n
        return total

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pending"] = self.pending
        met, finished = self.slo
        ratio = self.slo_ratio
        data["slo"] = {"met": met, "finished": finished,
                       "fraction": met / finished if finished else None,
                       "predicted": sum(ratio), "ratio_p50": slo.ratio_quantile(ratio, 0.5),
                       "ratio_p90": slo.ratio_quantile(ratio, 0.9)}
        return data


def live_workers(keys: QueueKeys, now: tuple[int, int] | None = None) -> Plan[list[str]]:
    """The queue's live workers, sorted. The one rule for "live": a liveness deadline
    (renewed by the heartbeat) not yet passed on the Redis clock (``now``, if already read)."""
    if now is None:
        (now,) = yield [call("execute_command", "TIME")]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    (workers,) = yield [call("zrangebyscore", keys.workers, now_ms, "+inf")]
    return sorted(as_str(w) for w in workers)


def new_windows(shard: QueueKeys, now: tuple[int, int],
                seen: set[str]) -> Plan[list[dict[str, str]]]:
    """The published window states (``QueueKeys.window``) of ``shard``'s live workers not in
    ``seen``, which they join: a worker that serves several shards counts once."""
    live = yield from live_workers(shard, now)
    fresh = [w for w in live if w not in seen]
    seen.update(fresh)
    if not fresh:
        return []
    raws = yield [call("hgetall", shard.window(w)) for w in fresh]
    return [{as_str(k): as_str(v) for k, v in r.items()} for r in raws]


def pending_by_priority(keys: QueueKeys) -> Plan[dict[int, int]]:
    """Count per priority band: one ZCOUNT per distinct priority present, not a scan. Each
    round trip counts one band and finds the first request of the next."""

    def first_from(low: str) -> Command:
        return call("zrangebyscore", keys.pending, low, "+inf", start=0, num=1, withscores=True)

    counts: dict[int, int] = {}
    (first,) = yield [first_from("-inf")]
    while first:
        priority, _ = scores.decode(float(first[0][1]))
        band_end = scores.band(priority) + scores.SEQ_LIMIT
        count, first = yield [call("zcount", keys.pending, scores.band(priority), f"({band_end}"),
                              first_from(str(band_end))]
        counts[priority] = int(count)
    return counts


def _number(text: str) -> Any:
    """A published number as a number (``"16"`` -> 16, ``"0.93"`` -> 0.93); other text as is."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def _window(raw: dict[Any, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {as_str(k): _number(as_str(v)) for k, v in raw.items()}
    for name in ("reasons", "sizes"):
        if isinstance(fields.get(name), str):
            fields[name] = json.loads(fields[name])
    return fields


def queue_stats(keys: QueueKeys, *, detail: bool = True) -> Plan[QueueStats]:
    """Depths, live workers and, with ``detail``, the counters, the recent throughput and
    each live worker's window. Without it (a worker's metrics): the gauges only."""
    now, inflight, dead, counted = yield [
        call("execute_command", "TIME"), call("zcard", keys.inflight), call("zcard", keys.dead),
        call("hgetall", keys.stats)]
    live = yield from live_workers(keys, now)
    pending = yield from pending_by_priority(keys)
    stats = {as_str(k): as_str(v) for k, v in counted.items()}
    tenants = {k[len(TENANT_COUNT):]: int(v) for k, v in stats.items()
               if k.startswith(TENANT_COUNT)}
    if not detail:
        stats = {}
    seconds = int(now[0])
    recent = 0
    for slot in range(64):
        ts = stats.get(f"ts:{slot}")
        if ts is not None and seconds - THROUGHPUT_WINDOW_S < int(ts) <= seconds:
            recent += int(stats.get(f"n:{slot}", "0"))
    windows = (yield [call("hgetall", keys.window(w)) for w in live]) if detail and live else []
    return QueueStats(
        queue=keys.queue,
        pending_by_priority=pending,
        inflight=int(inflight),
        dead_lettered=int(dead),
        live_workers=live,
        counters={k: int(v) for k, v in stats.items() if ":" not in k},
        throughput_per_s=recent / THROUGHPUT_WINDOW_S,
        windows={w: fields for w, raw in zip(live, windows, strict=False)
                 if (fields := _window(raw))},
        tenants=tenants,
    )


def shard_keys(keys: QueueKeys) -> Plan[list[QueueKeys]]:
    """The keys of every shard a queue has ever had (its ``shards_seen``, from its settings)."""
    (raw,) = yield [call("hgetall", keys.for_shard(0).config)]
    return keys.for_shard(0).shards(settings_from_hash(raw).claim_shards)


def all_live_workers(keys: QueueKeys) -> Plan[list[str]]:
    """``live_workers`` over every shard of the queue (a worker serving several is one)."""
    shards = yield from shard_keys(keys)
    (now,) = yield [call("execute_command", "TIME")]
    live: set[str] = set()
    for shard in shards:
        live.update((yield from live_workers(shard, now)))
    return sorted(live)


def served_queues(namespace: str = DEFAULT_NAMESPACE) -> Plan[frozenset[str]]:
    """The queues (``task:model``) some worker has served: the registry each worker adds its
    queue to when it starts."""
    (members,) = yield [call("smembers", queues_registry(namespace))]
    return frozenset(as_str(m) for m in members)


def merge(parts: list[QueueStats]) -> QueueStats:
    """One queue's stats from its shards' stats: counts summed, workers and windows united."""
    first = parts[0]
    pending: dict[int, int] = {}
    counters: dict[str, int] = {}
    windows: dict[str, dict[str, Any]] = {}
    tenants: dict[str, int] = {}
    for part in parts:
        for tenant, count in part.tenants.items():
            tenants[tenant] = tenants.get(tenant, 0) + count
        for priority, count in part.pending_by_priority.items():
            pending[priority] = pending.get(priority, 0) + count
        for name, value in part.counters.items():
            counters[name] = counters.get(name, 0) + value
        windows.update(part.windows)
    return QueueStats(
        queue=first.queue,
        pending_by_priority=pending,
        inflight=sum(p.inflight for p in parts),
        dead_lettered=sum(p.dead_lettered for p in parts),
        live_workers=sorted({w for p in parts for w in p.live_workers}),
        counters=counters,
        throughput_per_s=sum(p.throughput_per_s for p in parts),
        windows=windows,
        shards=len(parts),
        tenants=tenants,
    )


def sharded_queue_stats(keys: QueueKeys, *, detail: bool = True) -> Plan[QueueStats]:
    """``queue_stats`` summed over every shard the queue has ever had (one for most queues:
    one more round trip, the settings read)."""
    shards = yield from shard_keys(keys)
    parts = []
    for shard in shards:
        parts.append((yield from queue_stats(shard, detail=detail)))
    return merge(parts)


def known_queues(client: redis.Redis, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Queues a worker has served, and queues producers have enqueued to (which may have no
    worker yet)."""
    pipe = client.pipeline(transaction=False)
    pipe.smembers(queues_registry(namespace))
    pipe.smembers(requested_registry(namespace))
    served, requested = pipe.execute()
    return sorted({as_str(q) for q in served} | {as_str(q) for q in requested})


def read_queue(client: redis.Redis, keys: QueueKeys) -> QueueStats:
    """A queue's stats, summed over its shards."""
    return run(client, sharded_queue_stats(keys))


def read_window(client: redis.Redis, keys: QueueKeys, worker: str) -> dict[str, Any]:
    """One worker's published window and batch statistics (empty when it never published)."""
    return _window(client.hgetall(keys.window(worker)))


def read_all(client: redis.Redis, queues: list[str] | None = None,
             namespace: str = DEFAULT_NAMESPACE) -> list[QueueStats]:
    names = queues or known_queues(client, namespace)
    return [read_queue(client, QueueKeys(name, namespace)) for name in names]
