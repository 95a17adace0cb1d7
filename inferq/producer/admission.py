"""What a producer reads for admission by prediction (``inferq.protocol.slo``): with a queue's
settings, the fleet's service rate from the live workers' published figures, read (like the
settings) at most once per ``ClientOptions.settings_ttl_s``."""

from __future__ import annotations

from typing import Any

from inferq.plans import Plan, call
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import settings_from_hash
from inferq.protocol.slo import fleet_rate
from inferq.stats import new_windows


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
        windows += yield from new_windows(shard, now, seen)
    return raw, fleet_rate(windows)
