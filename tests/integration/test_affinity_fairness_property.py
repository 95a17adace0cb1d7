"""Property: claims under cache affinity keep the fair order's bounds. Random programs of
enqueues (tenants, weights, priorities, costs, as in test_fairness_property, each request with
one of a few system prompts) and claims by a worker holding a random set of those prompts;
after each claim, against the reference model of the fair order (``inferq.protocol.fair``):

* every request claimed is of the highest priority band pending (priority is never violated);
* every one is among the first ``CLAIM_WINDOW`` (or claim size) of that band in fair order, so
  no request is passed by more than that many later ones (plus its max wait, bounded in
  test_affinity_claims);
* the claim takes as many as that window holds, up to its size;
* the pending order of everything left is still exactly the model's.
"""

from __future__ import annotations

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferq.protocol import ops, prefix, scores
from inferq.protocol.codec import build_request, encode_request
from inferq.protocol.fair import Arrival, FairShard
from inferq.protocol.keys import QueueKeys
from tests.integration.test_fairness_property import Claim, arrivals
from tests.support.property import InputCounter, examples

KEYS = QueueKeys.for_model("generate", "fair")
SYSTEMS = [f"system prompt number {i} " * 30 for i in range(3)]
CHAINS = [prefix.prompt_chain(s + "question") for s in SYSTEMS]
inputs = InputCounter("affinity claims within the fair order's bounds")

steps = st.lists(st.one_of(
    st.lists(st.tuples(arrivals, st.integers(0, 2)), min_size=1, max_size=6),
    st.builds(Claim, st.integers(1, 5))), min_size=1, max_size=25)


def band_of(score: int) -> int:
    return score // scores.SEQ_LIMIT


@settings(max_examples=examples(60),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=steps, held=st.sets(st.integers(0, 2)))
def test_affinity_claims_stay_within_the_fair_orders_bounds(
        r: redis.Redis, program: list[object], held: set[int]) -> None:
    inputs.tried()
    r.flushdb()
    scripts = ops.register(r)
    hold_keys, hold_args = ops.hold_call(KEYS, "w", 60_000,
                                         [CHAINS[i][0] for i in sorted(held)])
    scripts["hold"](keys=hold_keys, args=hold_args)
    model = FairShard()
    counter = 0
    for step in program:
        if isinstance(step, Claim):
            order = sorted(model.pending, key=lambda i: (model.pending[i], i))
            keys, args = ops.claim_call(KEYS, "w", 60_000, step.count, 60_000,
                                        affinity="prefix", affinity_max_wait_ms=60_000)
            claimed = [c.id for c in ops.parse_claim(
                scripts["claim"](keys=keys, args=args)).claimed]
            if not order:
                assert claimed == []
                continue
            top = band_of(model.pending[order[0]])
            band = [i for i in order if band_of(model.pending[i]) == top]
            window = band[:max(prefix.CLAIM_WINDOW, step.count)]
            assert set(claimed) <= set(window)
            assert len(claimed) == min(step.count, len(window))
            for request_id in claimed:
                del model.pending[request_id]
        else:
            rows, items = [], []
            for (priority, tenant, weight, cost), system in step:  # type: ignore[attr-defined]
                counter += 1
                a = Arrival(f"r{counter:04d}", priority, tenant, weight, cost)
                rows.append(a)
                payload = build_request("x", id=a.id, task="generate", model="fair",
                                        priority=priority, tenant=tenant or None)
                items.append(ops.EnqueueItem(
                    a.id, scores.band(priority), encode_request(payload), None, 3,
                    tenant=tenant, weight=weight, cost=cost, prefixes=" ".join(CHAINS[system])))
            keys, args = ops.enqueue_call(KEYS, items)
            assert ops.parse_enqueue(scripts["enqueue"](keys=keys, args=args)).outcomes == [
                "queued"] * len(rows)
            model.enqueue(rows)
        stored = {k.decode(): int(v) for k, v in r.zrange(KEYS.pending, 0, -1, withscores=True)}
        assert stored == model.pending
