"""Where a prepared request goes: its queue's settings (``inferq queue set``, read from Redis
and cached) decide its shard, its share of the depth limit, its tenant's weight and limit and
the queue's admission policy."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferq.producer.options import ClientOptions
from inferq.producer.prepare import Prepared
from inferq.protocol import slo
from inferq.protocol.keys import QueueKeys, shard_of
from inferq.protocol.settings import QueueSettings, settings_from_hash


class SettingsCache:
    """Queue settings (``inferq queue set``) read from Redis, reused for ``ttl_s``: with one
    shard and the default depth, that read is the only extra cost, one HGETALL a second."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[QueueKeys, tuple[float, QueueSettings]] = {}

    def get(self, keys: QueueKeys) -> QueueSettings | None:
        known = self._known.get(keys)
        if known is None or known[0] <= self.clock():
            return None
        return known[1]

    def recent(self, keys: QueueKeys) -> QueueSettings | None:
        """The last settings read, once expired, for as long again as ``ttl_s`` (what an
        async client uses while it reads them again in the background)."""
        known = self._known.get(keys)
        if known is None or known[0] + self.ttl_s <= self.clock():
            return None
        return known[1]

    def put(self, keys: QueueKeys, raw: Mapping[Any, Any], service_rate: float | None = None,
            token_service: slo.TokenService | None = None) -> QueueSettings:
        settings = dataclasses.replace(settings_from_hash(raw), service_rate=service_rate,
                                       token_service=token_service)
        self._known[keys] = (self.clock() + self.ttl_s, settings)
        return settings


def queue_of(keys: QueueKeys) -> QueueKeys:
    """Shard 0 of a queue: where its settings live and what the cache is keyed by."""
    return keys.for_shard(0)


def route(prepared: Prepared, settings: QueueSettings, options: ClientOptions) -> Prepared:
    """The request on its shard (``shard_of`` its id: a repeated id meets its first copy), with
    its share of the queue's depth limit. The limit (the queue's ``max_depth`` if set, else
    ``max_queue_depth``, times the priority's ``Shedding`` fraction) is split evenly over the
    shards: each shard sheds at ``ceil(limit / shards)`` pending requests. The tenant's weight
    is the queue's (``inferq queue set --tenant-weight``), read with the settings."""
    max_depth = settings.max_depth if settings.max_depth is not None else options.max_queue_depth
    limit = options.shedding.limit(prepared.priority, max_depth)
    if limit and settings.shards > 1:
        limit = math.ceil(limit / settings.shards)
    keys = prepared.keys.for_shard(shard_of(prepared.item.id, settings.shards))
    weight = settings.weight(prepared.item.tenant)
    tenant_limit = settings.tenant_limit(prepared.item.tenant)
    if tenant_limit and settings.shards > 1:
        tenant_limit = math.ceil(tenant_limit / settings.shards)
    policy = slo.queue_policy(settings)
    if (keys == prepared.keys and limit == prepared.item.depth_limit
            and weight == prepared.item.weight and tenant_limit == prepared.item.tenant_limit
            and policy == prepared.item.policy):
        return prepared
    return dataclasses.replace(prepared, keys=keys, item=dataclasses.replace(
        prepared.item, depth_limit=limit, weight=weight, tenant_limit=tenant_limit,
        policy=policy))


def route_many(prepared: Sequence[Prepared], settings: Callable[[QueueKeys], QueueSettings],
               options: ClientOptions) -> list[Prepared]:
    """``route`` of each request, with ``settings`` of each queue asked once; on a queue of
    one shard, requests alike in what routing reads (priority, tenant, and the limits they
    carry) share one decision."""
    known: dict[int, QueueSettings] = {}
    same: dict[tuple[Any, ...], bool] = {}
    out = []
    for p in prepared:
        queue = known.get(id(p.keys))
        if queue is None:
            queue = known[id(p.keys)] = settings(p.keys)
        if queue.shards == 1:
            item = p.item
            alike = (id(p.keys), p.priority, item.tenant, item.depth_limit, item.weight,
                     item.tenant_limit, item.policy)
            unchanged = same.get(alike)
            if unchanged is None:
                unchanged = same[alike] = route(p, queue, options) is p
            if unchanged:
                out.append(p)
                continue
        out.append(route(p, queue, options))
    return out
