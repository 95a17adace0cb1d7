"""Cache affinity on a generate worker: it publishes what its engine's prefix cache holds,
and claims with the queue's affinity setting unless it is saturated.

What it publishes: the identities (``inferq.protocol.prefix``: a prompt's prefix hashes and
its session) of the generations it runs or has claimed, whose prompts its cache is about to
hold, and of the prompts the prefix cache holds (``prefixcache.PrefixCache.tie``), at most
``MAX_HELD``, in a set per shard with a TTL (``QueueKeys.held``, the ``hold`` script); with
``--engine vllm``, whose cache inferq cannot read, the prompts it served most recently
(``served.ServedPrefixes``) stand for those its cache holds. The set
is replaced whenever the held identities change and refreshed every third of its TTL, so a
worker that dies leaves nothing behind once the TTL passes; a worker that stops deletes it.

How it claims (``lua/includes/affinity.lua``): with the queue's ``affinity`` (``inferq queue
set --affinity prefix|session``) and ``affinity_max_wait_ms``, except while saturated (its
slots or KV budget at ``SATURATED`` or more): then it takes the head as without affinity, and
the requests it would have preferred go to whoever claims next (sticky until saturated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from inferq.protocol import ops
from inferq.protocol.prefix import MAX_HELD
from inferq.protocol.prefix import SATURATED as SATURATED_MEMBER
from inferq.worker.core.metrics import WorkerMetrics
from inferq.worker.core.queue_link import QueueLink
from inferq.worker.generate.engine import Engine
from inferq.worker.generate.steploop import Steps

log = logging.getLogger("inferq.worker")

#: Slots or KV budget in use at which a worker claims without affinity.
SATURATED = 0.9
#: How often the held identities are looked at (in memory) for a change.
CHECK_S = 0.2


def affinity_fields(metrics: WorkerMetrics, held: int, prompt_tokens: int,
                    reused_tokens: int) -> dict[str, str]:
    """The prefix cache's and the claims' figures: set on the Prometheus gauges, and returned
    for the worker's window hash (``inferq stats``)."""
    q = metrics.queue
    metrics.prefix_prompt_tokens.labels(q).set(prompt_tokens)
    metrics.prefix_reused_tokens.labels(q).set(reused_tokens)
    return {"held_prefixes": str(held), "prefix_prompt_tokens": str(prompt_tokens),
            "prefix_reused_tokens": str(reused_tokens),
            "claimed": str(metrics.claims_total),
            "affinity_claimed": str(metrics.affinity_claims_total)}


def held_ttl_ms(lease_ms: int) -> int:
    """The held set's TTL: three leases (at least 3 s), refreshed every third of it."""
    return max(3 * lease_ms, 3000)


def claim_mode(affinity: str, max_wait_ms: int, saturated: bool) -> tuple[str, int]:
    """The claim script's affinity arguments."""
    if affinity == "off" or saturated:
        return "", 0
    return affinity, max_wait_ms


def saturated(steps: Steps, engine: Engine) -> bool:
    """Whether the running and waiting generations fill ``SATURATED`` of the slots or of the
    KV budget (their reservations, as the scheduler counts them)."""
    running, waiting = steps.held()
    every = running + waiting
    if not every:
        return False
    budget = engine.budget
    kv = engine.footprint(len(every), max(g.reserve_tokens for g in every))
    return len(every) >= SATURATED * budget.max_slots or kv >= SATURATED * budget.kv_tokens


class HeldPublisher:
    """Keeps this worker's held set in Redis (see the module's doc)."""

    def __init__(self, link: QueueLink, steps: Steps, ttl_ms: int,
                 is_saturated: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic,
                 cached: Callable[[], Sequence[str]] | None = None) -> None:
        self.link = link
        self.steps = steps
        #: The cached identities, least recently used first: the prefix cache's, or (an
        #: engine whose cache inferq cannot read: vLLM) those of the requests it served.
        self.cached = cached or (lambda: steps.prefix_state()[1])
        self.is_saturated = is_saturated
        self.ttl_ms = ttl_ms
        self.clock = clock
        self._sent: frozenset[str] | None = None
        self._sent_at = -1e9
        #: Identities in the set last written.
        self.published = 0

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.refresh()
            except RedisError as exc:
                log.warning("cache affinity: publishing the held prefixes failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), CHECK_S)

    async def refresh(self) -> None:
        """Write the held set when it changed, or when a third of its TTL has passed."""
        members = self.members()
        due = self.clock() - self._sent_at >= self.ttl_ms / 3e3
        if (members == self._sent and not due) or (not members and self._sent is None):
            return
        await self._write(self.ttl_ms, sorted(members))
        self._sent, self._sent_at = members, self.clock()
        self.published = len(members)

    def members(self) -> frozenset[str]:
        """What the held set says: the identities of the generations this worker runs or has
        claimed (their prompts will be cached here: a claim that arrives meanwhile is as well
        placed here as once they are), then those its prefix cache holds, most recent first,
        at most ``MAX_HELD``; and ``saturated`` while it is."""
        running, waiting = self.steps.held()
        cached = self.cached()
        ordered = dict.fromkeys(i for g in (*running, *waiting) for i in g.identities)
        ordered.update(dict.fromkeys(reversed(cached)))
        chosen = list(ordered)[:MAX_HELD]
        return frozenset([*chosen, SATURATED_MEMBER] if self.is_saturated() else chosen)

    async def clear(self) -> None:
        """Delete the held set (the worker stops)."""
        if self._sent is not None:
            await self._write(0, [])
            self._sent = None

    async def _write(self, ttl_ms: int, held: list[str]) -> None:
        for keys in self.link.shard_keys:
            call_keys, args = ops.hold_call(keys, self.link.config.worker_id, ttl_ms, held)
            await self.link.scripts["hold"](keys=call_keys, args=args)
