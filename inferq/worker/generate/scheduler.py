"""Which waiting generations join the running batch at the next decode step (pure code).

Admission is in priority order (higher first, then arrival), strictly: the first waiting
request that does not fit stops admission, so a long request is never overtaken forever by
shorter ones of the same or lower priority. A request fits when

* a slot is free (``max_slots`` sequences decode together),
* the KV cache, with it, stays within the token budget. Each running sequence reserves room for
  its prompt plus its ``max_new_tokens`` (so nothing is preempted for room; only a device out of
  memory pushes sequences out, see ``steploop``), and the budget counts
  the cache's real footprint: rows x the longest reservation, rounded as the cache allocates;
* the prompts admitted in one step stay within ``max_prefill_tokens`` (a burst of long prompts
  is spread over several steps, so running sequences keep producing tokens); the first request
  of a step is always admitted if it fits the cache. A sequence admitted again after leaving the
  batch unfinished prefills its prompt and the tokens it generated (``prefill_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from inferq.errors import ConfigError


class Candidate(Protocol):
    @property
    def priority(self) -> int: ...

    @property
    def order(self) -> int: ...

    @property
    def prefill_tokens(self) -> int: ...

    @property
    def reserve_tokens(self) -> int: ...


C = TypeVar("C", bound=Candidate)


@dataclass(frozen=True, slots=True)
class Budget:
    max_slots: int
    #: Token positions the KV cache may occupy (all layers; see ``kvcache.footprint``).
    kv_tokens: int
    max_prefill_tokens: int

    def __post_init__(self) -> None:
        for name in ("max_slots", "kv_tokens", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


def priority_order(waiting: Sequence[C]) -> list[C]:
    return sorted(waiting, key=lambda c: (-c.priority, c.order))


def admit(waiting: Sequence[C], running_reserve: Sequence[int], budget: Budget,
          footprint: Callable[[int, int], int]) -> list[C]:
    """The waiting candidates to admit now, in priority order.

    ``running_reserve`` holds the reservation (prompt + max new tokens) of each running
    sequence; ``footprint(rows, longest)`` is the cache's size for that many rows."""
    chosen: list[C] = []
    rows = len(running_reserve)
    longest = max(running_reserve, default=0)
    prefill = 0
    for candidate in priority_order(waiting):
        if rows >= budget.max_slots:
            break
        new_longest = max(longest, candidate.reserve_tokens)
        if footprint(rows + 1, new_longest) > budget.kv_tokens:
            break
        if chosen and prefill + candidate.prefill_tokens > budget.max_prefill_tokens:
            break
        chosen.append(candidate)
        rows += 1
        longest = new_longest
        prefill += candidate.prefill_tokens
    return chosen


def fits_alone(reserve_tokens: int, budget: Budget, footprint: Callable[[int, int], int]) -> bool:
    return footprint(1, reserve_tokens) <= budget.kv_tokens
