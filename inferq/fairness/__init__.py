"""Fair shares inside a priority band: tenants, weights and token cost.

Every request may name a ``tenant``. Within one priority the enqueue script
(``lua/enqueue.lua``) gives each request a virtual finish time: its tenant's clock, started at
the later of the tenant's last finish and the band's virtual time (the head of the band), and
advanced by ``cost / weight``. The pending score orders by that finish time (``scores``), so
every worker and shard reads one fair order from Redis. ``cost`` estimates a request's tokens
(``cost.estimate``); ``model`` is the pure reference of the ordering the tests hold Redis to.
Requests without a tenant are one flow (``DEFAULT_TENANT``), so without tenants the order is
exactly priority, then FIFO.
"""

from __future__ import annotations

from inferq.fairness.cost import (
    DEFAULT_TENANT,
    DEFAULT_WEIGHT,
    MAX_COST,
    MAX_WEIGHT,
    RESET_AT,
    check_tenant,
    check_weight,
    estimate,
)

__all__ = ["DEFAULT_TENANT", "DEFAULT_WEIGHT", "MAX_COST", "MAX_WEIGHT", "RESET_AT",
           "check_tenant", "check_weight", "estimate"]
