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


@pytest.mark.parametrize("shards", [1, 5, 8, 64, 100])
def test_the_head_reads_cover_every_shard_within_the_bound(shards: int) -> None:
    """``head_priority`` and ``pending_above`` read the next group each call: every shard is
    read within ceil(S / PEEK_SHARDS) calls, and a call reads at most PEEK_SHARDS shards."""
    from inferq.protocol.keys import QueueKeys
    from inferq.protocol.settings import QueueSettings

    link = QueueLink.__new__(QueueLink)
    link.keys = QueueKeys.for_model("embed", "m")
    link.settings = QueueSettings(shards=shards, shards_seen=shards)
    link._head_turn = 0
    calls = -(-shards // PEEK_SHARDS)
    groups = [link._next_head_group() for _ in range(calls)]
    assert all(len(g) == min(shards, PEEK_SHARDS) for g in groups)
    assert {k.shard for g in groups for k in g} == set(range(shards))
