"""Which waiting generations join the running batch at the next decode step (pure code).

Admission is in priority order (higher first, then arrival), strictly: the first waiting
request that does not fit stops admission, so a long request is never overtaken forever by
shorter ones of the same or lower priority. A request fits when

* a slot is free (``max_slots`` sequences decode together),
* the KV cache, with it, stays within the token budget. Each running sequence reserves room for
  its prompt plus its ``max_new_tokens`` (so a sequence never runs out of room mid-way), and the
  budget counts the cache's real footprint: rows x the longest reservation, rounded as the
  cache allocates;
* the prompts admitted in one step stay within ``max_prefill_tokens`` (a burst of long prompts
  is spread over several steps, so running sequences keep producing tokens); the first request
  of a step is always admitted if it fits the cache. A sequence admitted again after leaving the
  batch unfinished prefills its prompt and the tokens it generated (``prefill_tokens``).

Preemption (``plan``): when the first waiting request that admission stops at has strictly
higher priority than a running sequence, and it stops for room (no free slot, or no KV budget;
not the prefill budget, which the next step renews), running sequences of lower priority are
pushed out until it fits: the lowest priority first, and among equal priorities the latest
admitted (it has the least to recompute). A preempted sequence keeps its tokens and waits to be
admitted again (the caller puts it back in its waiting list), prefilling its prompt and tokens.
Guards against thrashing: only a strictly higher priority preempts; nothing is preempted when
removing every candidate would still not make room; a slot that frees at the end of the step in
flight (a sequence reaching ``max_new_tokens``) is waited for instead; and a sequence already
preempted ``max_preemptions`` times is not preempted again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

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


class Yielding(Protocol):
    """A running sequence as the preemption rule sees it."""

    @property
    def priority(self) -> int: ...

    @property
    def preemptions(self) -> int:
        """Times this sequence was preempted so far."""


Y = TypeVar("Y", bound=Yielding)


def preemptible(running: Iterable[Y], priority: int | None, *, max_preemptions: int
                ) -> list[Y]:
    """The preemption rule, for its two callers (``plan`` on the device; the generate worker's
    watch of the head of pending, which claims for it): the running sequences a waiting request
    of ``priority`` may push out, those of strictly lower priority preempted fewer than
    ``max_preemptions`` times. ``priority`` None: those that some higher priority could push
    out (the worker asks before it reads the head)."""
    return [r for r in running if r.preemptions < max_preemptions
            and (priority is None or r.priority < priority)]


class Preemptible(Candidate, Yielding, Protocol):

    @property
    def entered(self) -> int:
        """When it was (last) admitted, in steps: the larger, the later."""

    @property
    def due(self) -> bool:
        """Whether it reaches its last token in the step in flight (its slot frees then)."""


R = TypeVar("R", bound=Preemptible)


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


@dataclass(frozen=True, slots=True)
class Plan(Generic[C, R]):
    #: Waiting candidates to admit at this step, in priority order.
    admitted: list[C]
    #: Running sequences to push out before it (they wait to be admitted again).
    preempted: list[R]


def plan(waiting: Sequence[C], running: Sequence[R], budget: Budget,
         footprint: Callable[[int, int], int], *, max_preemptions: int) -> Plan[C, R]:
    """This step's admissions, and the preemptions that make room for them (module
    docstring). ``max_preemptions`` 0 turns preemption off: then it is ``admit``."""
    order = priority_order(waiting)
    preempted: list[R] = []
    kept = list(running)
    while True:
        admitted = admit(order, [r.reserve_tokens for r in kept], budget, footprint)
        if len(admitted) == len(order) or max_preemptions <= 0:
            return Plan(admitted, preempted)
        blocked = order[len(admitted)]  # admission is strict: it stopped here
        rows = len(kept) + len(admitted)
        reserves = [c.reserve_tokens for c in (*kept, *admitted)]
        if rows < budget.max_slots and footprint(
                rows + 1, max([*reserves, blocked.reserve_tokens])) <= budget.kv_tokens:
            return Plan(admitted, preempted)  # stopped by the prefill budget: next step
        if rows >= budget.max_slots and any(r.due for r in kept):
            return Plan(admitted, preempted)  # a slot frees at the end of this step
        victims = sorted(preemptible(kept, blocked.priority, max_preemptions=max_preemptions),
                         key=lambda r: (r.priority, -r.entered, -r.order))
        rest = [r.reserve_tokens for r in kept if r not in victims]
        if not victims or not _fits(len(rest) + len(admitted) + 1,
                                    [*rest, *(c.reserve_tokens for c in admitted),
                                     blocked.reserve_tokens], budget, footprint):
            return Plan(admitted, preempted)
        preempted.append(victims[0])
        kept.remove(victims[0])


def _fits(rows: int, reserves: Sequence[int], budget: Budget,
          footprint: Callable[[int, int], int]) -> bool:
    return rows <= budget.max_slots and footprint(rows, max(reserves)) <= budget.kv_tokens
