"""Fair shares inside a priority band: tenants, weights and token cost, and the reference
model of the pending order of one queue shard.

Every request may name a ``tenant``. Within one priority the enqueue script
(``lua/enqueue.lua``) gives each request a virtual finish time: its tenant's clock, started at
the later of the tenant's last finish and the band's virtual time (the head of the band), and
advanced by ``cost / weight``. The pending score orders by that finish time (``scores``), so
every worker and shard reads one fair order from Redis. ``cost`` estimates a request's tokens
(``cost.estimate``); this module is the pure reference of the ordering the tests hold Redis
to. Requests without a tenant are one flow (``DEFAULT_TENANT``), so without tenants the order
is exactly priority, then FIFO.

The reference model is pure code (no Redis, no clock), step for step what
``lua/enqueue.lua`` (with ``lua/includes/fair.lua``) computes and what ``claim`` takes. The
property test (``tests/integration/test_fairness_property.py``) holds the real scripts to it.

Within a priority band each request gets a virtual finish time (start-time fair queuing on
cost, SCFQ's self-clocked virtual time)::

    v      = the band's virtual time: the finish time of the band's head (the pending request
             the next claim takes), or, when none of the band is pending, the latest finish
             time of the band's epoch (an idle band restarts at 0 once that passed RESET_AT)
    start  = max(the tenant's last finish time in this band and epoch, v)
    finish = start + cost / weight

and the score is ``band + floor(finish) * TIE_LIMIT + seq % TIE_LIMIT`` (``scores.tag``):
priority first, then finish time, then arrival. A tenant that was idle starts at ``v``, so it
banks no credit; a new one starts at ``v`` too, next to the head. ``v`` is read once per
enqueue call (before any of its requests is added), as the script does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferq.protocol import scores
from inferq.protocol.cost import RESET_AT


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of an enqueue call."""

    id: str
    priority: int
    tenant: str = ""
    weight: int = 1
    cost: int = 1


@dataclass(slots=True)
class _Band:
    epoch: int = 0
    latest: float = 0.0


@dataclass
class FairShard:
    """The pending set of one shard and its fair clocks."""

    seq: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    _bands: dict[int, _Band] = field(default_factory=dict)
    #: (band level, tenant) -> (epoch, last finish time)
    _tenants: dict[tuple[int, str], tuple[int, float]] = field(default_factory=dict)

    def _virtual_time(self, band: int, level: int) -> float:
        clock = self._bands.setdefault(level, _Band())
        in_band = [s for s in self.pending.values() if band <= s < band + scores.SEQ_LIMIT]
        if in_band:
            return float((min(in_band) - band) // scores.TIE_LIMIT)
        if clock.latest >= RESET_AT:
            clock.epoch, clock.latest = clock.epoch + 1, 0.0
        return clock.latest

    def enqueue(self, arrivals: Sequence[Arrival]) -> list[int]:
        """One enqueue call (every id new): the scores given, in order."""
        first = self.seq + 1
        self.seq += len(arrivals)
        now: dict[int, float] = {}
        out: list[int] = []
        for n, a in enumerate(arrivals):
            band = scores.band(a.priority)
            level = band // scores.SEQ_LIMIT
            if level not in now:
                now[level] = self._virtual_time(band, level)
            clock = self._bands[level]
            epoch, last = self._tenants.get((level, a.tenant), (clock.epoch, 0.0))
            if epoch != clock.epoch:
                last = 0.0
            finish = max(last, now[level]) + a.cost / a.weight
            self._tenants[(level, a.tenant)] = (clock.epoch, finish)
            clock.latest = max(clock.latest, finish)
            out.append(band + scores.tag(math.floor(finish), first + n))
        for a, score in zip(arrivals, out, strict=True):
            self.pending[a.id] = score
        return out

    def claim(self, count: int) -> list[str]:
        """The ``count`` requests a claim takes: lowest score first (ties: by id, as a sorted
        set orders equal scores)."""
        taken = sorted(self.pending, key=lambda i: (self.pending[i], i))[:count]
        for request_id in taken:
            del self.pending[request_id]
        return taken
