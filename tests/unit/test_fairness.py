"""Fair shares without a server: the cost estimate, tenant settings, the bounded metric label,
and the reference model's own promises (FIFO without tenants, weights, no banked credit,
the exact-double bound)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from inferq.errors import ValidationError
from inferq.protocol import ops, scores
from inferq.protocol.codec import RequestPayload
from inferq.protocol.cost import MAX_COST, estimate
from inferq.protocol.fair import Arrival, FairShard
from inferq.protocol.settings import settings_from_hash, tenants_call
from inferq.worker.core.metrics import WorkerMetrics
from inferq.worker.core.results import Claim


def test_cost_estimates_tokens_without_a_tokenizer() -> None:
    assert estimate("embed", 400, {}, None) == 100           # bytes / 4
    assert estimate("embed", 1, {}, None) == 1               # never below 1
    assert estimate("score", 9, {}, None) == 3               # rounded up
    assert estimate("generate", 40, {"max_new_tokens": 64}, None) == 74
    assert estimate("generate", 40, {}, None) == 138         # default max_new_tokens 128
    assert estimate("classify", 4000, {}, None) == 1         # custom: 1 ...
    assert estimate("classify", 4000, {}, 25) == 25          # ... or the producer's cost
    assert estimate("generate", 1 << 40, {}, None) == MAX_COST


def test_tenant_settings_round_trip_through_the_config_hash() -> None:
    _, args = tenants_call("cfg", weights={"team-a": 3, "team-b": 1}, default_weight=2,
                           max_depths={"team-a": 1000})
    raw = {args[i]: args[i + 1] for i in range(0, len(args), 3) if args[i + 2] == "set"}
    s = settings_from_hash(raw)
    assert s.weight("team-a") == 3 and s.weight("team-b") == 1
    assert s.weight("anyone") == 2 and s.weight(None) == 2
    assert s.tenant_limit("team-a") == 1000 and s.tenant_limit("team-b") == 0
    assert s.tenants == {"team-a", "team-b"}
    # unreadable values keep the defaults instead of failing the producer
    odd = settings_from_hash({"tenant_weight:x": "zero", "default_weight": "-1",
                              "tenant_weight:y": "0", "tenant_max_depth:z": "nan"})
    assert odd.tenant_weights == () and odd.default_weight == 1 and odd.tenant_max_depth == ()
    for bad in ({"weights": {"a": 0}}, {"weights": {"a b": 1}}, {"default_weight": 10**7},
                {"max_depths": {"a": -1}}, {"remove": ("a:b",)}):
        with pytest.raises(ValidationError):
            tenants_call("cfg", **bad)  # type: ignore[arg-type]


def _claim(i: int, tenant: str | None, prompt: str = "abcd") -> Claim:
    claimed = ops.Claimed(f"r{i}", b"", "t", 1, 1_000, None)
    payload = RequestPayload(id=f"r{i}", task="embed", model="m", prompt=prompt, tenant=tenant)
    return Claim(claimed, payload, 0.0, None, 1_000 + 100 * i)


def _values(registry: CollectorRegistry, name: str) -> dict[str, float]:
    return {s.labels["tenant"]: s.value for metric in registry.collect()
            for s in metric.samples if s.name == name}


def test_only_named_tenants_get_a_label_of_their_own() -> None:
    metrics = WorkerMetrics("embed:m", "w")
    metrics.tenants = frozenset({"team-a"})
    claims = [_claim(0, "team-a", "x" * 40), _claim(1, "team-b"), _claim(2, None),
              *[_claim(3 + i, f"t{i}") for i in range(50)]]
    metrics.observe_latencies(claims, 10_000)
    cost = _values(metrics.registry, "inferq_tenant_cost_total")
    assert cost == {"team-a": 10, "other": 52}
    waits = _values(metrics.registry, "inferq_tenant_queue_wait_seconds_count")
    assert waits == {"team-a": 1, "other": 52}


def test_without_tenants_the_model_is_priority_then_fifo() -> None:
    shard = FairShard()
    arrivals = [Arrival(f"r{i:03d}", priority=(i * 5) % 3, cost=1 + i % 7) for i in range(120)]
    for start in range(0, 120, 7):
        shard.enqueue(arrivals[start:start + 7])
    expected = [a.id for a in sorted(arrivals, key=lambda a: (-a.priority, a.id))]
    assert shard.claim(1000) == expected


def test_the_model_shares_by_weight_and_banks_no_credit() -> None:
    shard = FairShard()
    shard.enqueue([Arrival(f"a{i}", 0, "a", 3, 30) for i in range(300)]
                  + [Arrival(f"b{i}", 0, "b", 1, 30) for i in range(300)])
    assert Counter(i[0] for i in shard.claim(200)) == {"a": 150, "b": 50}
    shard.claim(1000)
    shard.enqueue([Arrival(f"c{i}", 0, "c", 1, 30) for i in range(100)])
    shard.claim(90)  # 'd' idles meanwhile
    shard.enqueue([Arrival(f"d{i}", 0, "d", 1, 30) for i in range(20)]
                  + [Arrival(f"e{i}", 0, "c", 1, 30) for i in range(20)])
    order = shard.claim(20)
    assert order[0] == "c90" and sum(i[0] == "d" for i in order) <= 11  # no burst for 'd'
    assert all(s < 2**53 for s in shard.pending.values())


def test_scores_stay_exact_doubles_at_the_clamp() -> None:
    worst = scores.band(scores.PRIORITY_MIN) + scores.tag(scores.VT_LIMIT * 4, 2**40 - 1)
    assert worst < 2**53 and float(worst) == worst
    shard = FairShard()
    shard.enqueue([Arrival(f"r{i}", -100, "a", 1, MAX_COST) for i in range(5)])
    top = scores.band(-100) + scores.SEQ_LIMIT
    assert all(s < top for s in shard.pending.values())


@settings(max_examples=150, deadline=None)
@given(weights=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       costs=st.tuples(st.lists(st.integers(1, 300), min_size=30, max_size=60),
                       st.lists(st.integers(1, 300), min_size=30, max_size=60)),
       batches=st.integers(1, 8))
def test_two_waiting_tenants_stay_within_one_request_of_each_other(
        weights: tuple[int, int], costs: tuple[list[int], list[int]], batches: int) -> None:
    """docs/guides/fair-sharing.md: while two tenants both have requests pending in a band (of one
    shard), their served cost per weight differs by less than the larger cost / weight of one
    request, plus one cost unit, after every claim."""
    shard = FairShard()
    for part in range(batches):  # arrivals spread over several enqueue calls
        shard.enqueue([Arrival(f"{t}{i:03d}", 0, t, weights[k], c)
                       for k, t in enumerate("xy") for i, c in enumerate(costs[k])
                       if i % batches == part])
    cost = {f"{t}{i:03d}": c for k, t in enumerate("xy") for i, c in enumerate(costs[k])}
    served = {"x": 0.0, "y": 0.0}
    left = {"x": len(costs[0]), "y": len(costs[1])}
    bound = max(max(costs[0]) / weights[0], max(costs[1]) / weights[1]) + 1
    while left["x"] and left["y"]:
        (request_id,) = shard.claim(1)
        tenant = request_id[0]
        served[tenant] += cost[request_id] / weights["xy".index(tenant)]
        left[tenant] -= 1
        if left["x"] and left["y"]:
            assert abs(served["x"] - served["y"]) < bound
