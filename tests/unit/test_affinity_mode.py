"""A generate worker's claim arguments under cache affinity (``affinity.claim_mode``,
``saturated``): sticky until saturated."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inferq.worker.generate.affinity import SATURATED, claim_mode, held_ttl_ms, saturated
from inferq.worker.generate.kvcache import footprint
from inferq.worker.generate.scheduler import Budget


def fake(running: int, waiting: int, reserve: int, budget: Budget) -> tuple[Any, Any]:
    gen = SimpleNamespace(reserve_tokens=reserve)
    steps = SimpleNamespace(held=lambda: ([gen] * running, [gen] * waiting))
    engine = SimpleNamespace(budget=budget,
                             footprint=lambda rows, longest: footprint(rows, longest,
                                                                       budget.max_slots))
    return steps, engine


def test_the_mode_is_the_queues_until_the_worker_is_saturated() -> None:
    assert claim_mode("prefix", 500, saturated=False) == ("prefix", 500)
    assert claim_mode("session", 0, saturated=False) == ("session", 0)
    assert claim_mode("prefix", 500, saturated=True) == ("", 0)
    assert claim_mode("off", 500, saturated=False) == ("", 0)


def test_saturated_by_slots_or_by_kv_budget() -> None:
    roomy = Budget(max_slots=10, kv_tokens=1 << 20, max_prefill_tokens=512)
    assert not saturated(*fake(0, 0, 100, roomy))
    assert not saturated(*fake(5, 3, 100, roomy))            # 8 of 10 slots
    assert saturated(*fake(6, 3, 100, roomy))                # 9 of 10 = SATURATED
    assert SATURATED == 0.9
    tight = Budget(max_slots=10, kv_tokens=footprint(8, 1000, 10), max_prefill_tokens=512)
    assert not saturated(*fake(4, 0, 1000, tight))           # half the KV budget, 4 slots
    assert saturated(*fake(8, 0, 1000, tight))               # all of it, 8 of 10 slots


def test_the_held_set_outlives_a_few_leases() -> None:
    assert held_ttl_ms(2000) == 6000 and held_ttl_ms(200) == 3000


def test_the_held_set_names_claimed_generations_then_cached_prompts() -> None:
    from inferq.protocol.prefix import MAX_HELD, SATURATED
    from inferq.worker.generate.affinity import HeldPublisher

    running = [SimpleNamespace(identities=("a1", "a2"))]
    waiting = [SimpleNamespace(identities=("b1",))]
    cached = [f"c{i}" for i in range(MAX_HELD + 10)]  # most recently used last
    steps = SimpleNamespace(held=lambda: (running, waiting),
                            prefix_state=lambda: (1, cached, 0, 0))
    busy = [False]
    publisher = HeldPublisher(SimpleNamespace(), steps, 3000,  # type: ignore[arg-type]
                              lambda: busy[0])
    members = publisher.members()
    assert {"a1", "a2", "b1"} <= members and len(members) == MAX_HELD
    assert f"c{MAX_HELD + 9}" in members and "c0" not in members  # the least recent go
    busy[0] = True
    assert publisher.members() == members | {SATURATED}
