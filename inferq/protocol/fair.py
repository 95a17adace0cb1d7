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
    start  = the tenant's last finish time in this band and epoch if its highest finish time
             there is >= v (it is backlogged), else v
    finish = start + cost / weight

and the score is ``band + floor(finish) * TIE_LIMIT + seq % TIE_LIMIT`` (``scores.tag``):
priority first, then finish time, then arrival. A tenant that was idle starts at ``v``, so it
banks no credit; a new one starts at ``v`` too, next to the head. ``v`` is read once per
enqueue call (before any of its requests is added), as the script does.

Without give-backs the last and the highest finish time are one, and ``start`` is
``max(last, v)``. The clock is charged the estimate, so a generation is charged its whole
``max_new_tokens``. When the result of a named tenant's request is written
(``lua/complete.lua`` with ``lua/includes/refund.lua``; here ``FairShard.complete``), the
tokens it did not use come back: ``last -= (cost - used) / weight`` (at least 0), where
``used`` is its prompt + completion tokens as the worker counted them, if ``0 < used < cost``
and the tenant's clock is still in the epoch it was charged in; the highest finish time stays.
Its own score and the scores of what is already pending do not move; the tenant's next arrival
starts that much earlier if the tenant is still backlogged then (its highest finish not passed
by the head; this may place it before the tenant's own older requests), so a tenant that keeps
work waiting gets shares by the tokens it actually used (VTC's counters, Sheng et al., OSDI
'24, settled at completion). A tenant that was not backlogged starts at ``v`` as before: what
it was given back while it had nothing waiting is not banked. Nothing is charged beyond the
estimate, and requests without a tenant get nothing back (they stay one exact FIFO flow).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferq.protocol import scores
from inferq.protocol.cost import DEFAULT_TENANT, RESET_AT


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


@dataclass(frozen=True, slots=True)
class _Charge:
    """What a tenant's request charged its clock (the request hash's ``Field.CHARGE``)."""

    level: int
    epoch: int
    tenant: str
    weight: int
    cost: int


@dataclass
class FairShard:
    """The pending set of one shard and its fair clocks."""

    seq: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    _bands: dict[int, _Band] = field(default_factory=dict)
    #: (band level, tenant) -> (epoch, last finish time, highest finish time)
    _tenants: dict[tuple[int, str], tuple[int, float, float]] = field(default_factory=dict)
    #: id -> its charge, from enqueue until its result is written (named tenants only)
    _charges: dict[str, _Charge] = field(default_factory=dict)

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
            epoch, last, high = self._tenants.get((level, a.tenant), (clock.epoch, 0.0, 0.0))
            if epoch != clock.epoch:
                last = high = 0.0
            start = last if high >= now[level] else now[level]
            finish = start + a.cost / a.weight
            self._tenants[(level, a.tenant)] = (clock.epoch, finish, max(high, finish))
            clock.latest = max(clock.latest, finish)
            if a.tenant != DEFAULT_TENANT:
                self._charges[a.id] = _Charge(level, clock.epoch, a.tenant, a.weight, a.cost)
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

    @property
    def clocks(self) -> dict[str, tuple[int, float, float]]:
        """The tenants' clocks as the fair hash holds them: ``f:<level>:<tenant>`` ->
        (epoch, last finish time, highest finish time)."""
        return {f"f:{level}:{tenant}": clock for (level, tenant), clock in self._tenants.items()}

    def complete(self, request_id: str, used: int) -> None:
        """A claimed request's final result is written, and it used ``used`` tokens: its
        tenant's clock gets back what it was charged beyond that (see the module
        docstring)."""
        charge = self._charges.pop(request_id, None)
        if charge is None or not 0 < used < charge.cost:
            return
        key = (charge.level, charge.tenant)
        got = self._tenants.get(key)
        if got is None or got[0] != charge.epoch:
            return
        epoch, last, high = got
        self._tenants[key] = (epoch, max(0.0, last - (charge.cost - used) / charge.weight), high)
