"""Choose which claimed requests form the next batch, and order them to cut padding.

Selection keeps queue order (priority, then FIFO; carried-over requests first) and stops at
the count limit or at the padded-token budget: a batch costs ``rows x longest row`` tokens
after padding. The first request always fits, so an over-long request still runs (alone).
The chosen rows are then sorted by length, and padding efficiency (real / padded tokens) is
reported for metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Packed(Generic[T]):
    batch: list[T]
    rest: list[T]
    real_tokens: int
    padded_tokens: int

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


def padded_cost(lengths: Sequence[int]) -> int:
    return len(lengths) * max(lengths, default=0)


def pack(items: Sequence[T], length: Callable[[T], int], *, max_count: int,
         max_tokens: int | None) -> Packed[T]:
    batch: list[T] = []
    rest: list[T] = []
    longest = 0
    for item in items:
        n = length(item)
        fits = len(batch) < max_count and (
            not batch or max_tokens is None or (len(batch) + 1) * max(longest, n) <= max_tokens
        )
        if fits and not rest:
            batch.append(item)
            longest = max(longest, n)
        else:
            rest.append(item)
    batch.sort(key=length)
    real = sum(length(item) for item in batch)
    return Packed(batch=batch, rest=rest, real_tokens=real, padded_tokens=len(batch) * longest)


def fill_tokens(items: Sequence[T], length: Callable[[T], int]) -> int:
    """Padded tokens the items would cost as one batch (what the budget is checked against)."""
    return padded_cost([length(item) for item in items])
