"""``scheduler.preemptible``: the one preemption rule, used by ``plan`` (the device) and by the
generate worker's watch of the head of pending (table-driven, pure code)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inferq.worker.generate.scheduler import preemptible


@dataclass(frozen=True)
class Running:
    priority: int
    preemptions: int


@pytest.mark.parametrize(("running", "waiting", "limit", "yields"), [
    (Running(priority=0, preemptions=0), 1, 4, True),       # strictly higher: yields
    (Running(priority=0, preemptions=0), 0, 4, False),      # equal priority: never
    (Running(priority=5, preemptions=0), 1, 4, False),      # lower: never
    (Running(priority=-100, preemptions=0), 100, 4, True),  # the whole range
    (Running(priority=0, preemptions=3), 1, 4, True),       # under the limit
    (Running(priority=0, preemptions=4), 1, 4, False),      # at the limit: no more
    (Running(priority=0, preemptions=0), 1, 0, False),      # limit 0: preemption off
    (Running(priority=100, preemptions=0), None, 1, True),  # None: any higher priority
    (Running(priority=0, preemptions=1), None, 1, False),   # ... still under the limit
])
def test_a_running_sequence_yields_only_to_a_strictly_higher_priority_under_the_limit(
        running: Running, waiting: int | None, limit: int, yields: bool) -> None:
    assert preemptible([running], waiting, max_preemptions=limit) == ([running] if yields
                                                                      else [])


def test_it_keeps_the_running_order_and_drops_only_those_that_may_not_yield() -> None:
    a, b, c = Running(1, 0), Running(9, 0), Running(2, 7)
    assert preemptible([a, b, c], 5, max_preemptions=4) == [a]
    assert preemptible([a, b, c], None, max_preemptions=8) == [a, b, c]
