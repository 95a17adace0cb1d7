"""What a producer reads for admission by prediction (``inferq.protocol.slo``): with a queue's
settings, the fleet's service rate from the live workers' published figures, read (like the
settings) at most once per ``ClientOptions.settings_ttl_s``."""

from __future__ import annotations

from typing import Any

from inferq.plans import Plan, call
from inferq.protocol.keys import QueueKeys
from inferq.protocol.ops import as_str
from inferq.protocol.settings import settings_from_hash
from inferq.protocol.slo import fleet_rate
from inferq.stats import live_workers


def read_settings(queue: QueueKeys) -> Plan[tuple[Any, float | None]]:
    """The config hash of ``queue`` (shard 0) and, when its admission is ``predicted``, the
    requests per second its live workers serve (None when unknown or not needed)."""
    (raw,) = yield [call("hgetall", queue.config)]
    settings = settings_from_hash(raw)
    if settings.admission != "predicted":
        return raw, None
    (now,) = yield [call("execute_command", "TIME")]
    seen: set[str] = set()
    windows: list[dict[str, str]] = []
    for shard in queue.shards(settings.claim_shards):
        live = yield from live_workers(shard, now)
        fresh = [w for w in live if w not in seen]
        seen.update(fresh)
        if fresh:
            raws = yield [call("hgetall", shard.window(w)) for w in fresh]
            windows += [{as_str(k): as_str(v) for k, v in r.items()} for r in raws]
    return raw, fleet_rate(windows)
