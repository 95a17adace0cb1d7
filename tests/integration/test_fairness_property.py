"""Property: the pending order a real server builds from random tenants, weights, priorities
and costs (the ``enqueue`` script) is the reference model's (``inferq.protocol.fair``), and
so is the order the ``claim`` script takes requests in.

Each example is a program of steps against one empty queue: enqueue calls (1-6 requests each,
one script call: tenants from a small pool, none included, weights 1-5, priorities from a few
bands, costs mostly small, sometimes huge so that the clamp at the top of a band and the reset
of an idle band's clock are exercised) and claims of 1-5 requests. After every step the whole
pending set (ids and scores) must equal the model's, and every claim must return the model's
ids in the model's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferq.protocol import ops, scores
from inferq.protocol.codec import build_request, encode_request
from inferq.protocol.cost import MAX_COST
from inferq.protocol.fair import Arrival, FairShard
from inferq.protocol.keys import QueueKeys
from tests.support.property import InputCounter, examples

KEYS = QueueKeys.for_model("embed", "fair")
inputs = InputCounter("fair order = reference model")


@dataclass(frozen=True)
class Claim:
    count: int


costs = st.one_of(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40),
                  st.sampled_from([MAX_COST, MAX_COST // 3, 1 << 28]))
arrivals = st.builds(
    lambda priority, tenant, weight, cost: (priority, tenant, weight, cost),
    st.sampled_from([0, 0, 0, 5, -3]), st.sampled_from(["", "a", "b", "c", "team-d"]),
    st.integers(1, 5), costs)
steps = st.lists(st.one_of(st.lists(arrivals, min_size=1, max_size=6),
                           st.builds(Claim, st.integers(1, 5))), min_size=1, max_size=25)


def enqueue(r: redis.Redis, script: object, rows: list[Arrival]) -> None:
    items = []
    for a in rows:
        payload = build_request("x", id=a.id, task="embed", model="fair", priority=a.priority,
                                tenant=a.tenant or None)
        items.append(ops.EnqueueItem(a.id, scores.band(a.priority), encode_request(payload),
                                     None, 3, tenant=a.tenant, weight=a.weight, cost=a.cost))
    keys, args = ops.enqueue_call(KEYS, items)
    reply = ops.parse_enqueue(script(keys=keys, args=args))  # type: ignore[operator]
    assert reply.outcomes == ["queued"] * len(rows)


@settings(max_examples=examples(60),
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # flushdb per example
@given(program=steps)
def test_claim_order_equals_the_reference_model(
        r: redis.Redis, program: list[list[tuple[int, str, int, int]] | Claim]) -> None:
    inputs.tried()
    r.flushdb()
    scripts = ops.register(r)
    model = FairShard()
    counter = 0
    for step in program:
        if isinstance(step, Claim):
            keys, args = ops.claim_call(KEYS, "w", 60_000, step.count, 60_000)
            claimed = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
            assert [c.id for c in claimed] == model.claim(step.count)
        else:
            rows = []
            for priority, tenant, weight, cost in step:
                counter += 1
                rows.append(Arrival(f"r{counter:04d}", priority, tenant, weight, cost))
            enqueue(r, scripts["enqueue"], rows)
            model.enqueue(rows)
        stored = {k.decode(): int(v) for k, v in r.zrange(KEYS.pending, 0, -1, withscores=True)}
        assert stored == model.pending
        assert all(s < 2**53 for s in stored.values())
    keys, args = ops.claim_call(KEYS, "w", 60_000, 1000, 60_000)
    rest = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
    assert [c.id for c in rest] == model.claim(1000)
