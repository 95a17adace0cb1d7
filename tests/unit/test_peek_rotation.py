"""Which shards a claim round of a sharded queue peeks first (``QueueLink._first_peeked``):
every shard comes first in turn, and with more shards than PEEK_SHARDS the rounds of one
cycle peek disjoint groups that together cover every shard."""

from __future__ import annotations

import pytest

from inferq.worker.core.queue_link import PEEK_SHARDS, QueueLink


def firsts(shards: int, rounds: int) -> list[int]:
    link = QueueLink.__new__(QueueLink)
    link._shard_turn = 0
    out = []
    for _ in range(rounds):
        out.append(link._first_peeked(shards))
        link._shard_turn += 1
    return out


@pytest.mark.parametrize("shards", [2, 3, 8, 9, 64, 100, 256])
def test_every_shard_is_peeked_first_in_turn(shards: int) -> None:
    if shards <= PEEK_SHARDS:
        assert sorted(firsts(shards, shards)) == list(range(shards))
    else:  # within PEEK_SHARDS cycles
        rounds = -(-shards // PEEK_SHARDS) * PEEK_SHARDS
        assert set(firsts(shards, rounds)) == set(range(shards))


@pytest.mark.parametrize("shards", [9, 64, 100, 256])
def test_one_cycle_of_rounds_peeks_every_shard(shards: int) -> None:
    cycle = -(-shards // PEEK_SHARDS)
    peeked = {(first + i) % shards for first in firsts(shards, cycle)
              for i in range(PEEK_SHARDS)}
    assert peeked == set(range(shards))
