"""What a worker whose prefix cache inferq cannot read (``--engine vllm``) publishes: the
identities of the requests it served, a bounded LRU (``served.ServedPrefixes``), through the
same held set as the transformers engine's cache (``affinity.HeldPublisher``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferq.protocol.prefix import MAX_HELD
from inferq.worker.generate.affinity import HeldPublisher
from inferq.worker.generate.served import ServedPrefixes


def test_the_least_recently_served_are_forgotten_first() -> None:
    served = ServedPrefixes(capacity=3)
    served.note(["a1", "a2"])
    served.note(["b1"])
    served.note(["a1"])  # served again: the most recent now
    assert served.held() == ["a2", "b1", "a1"]
    served.note(["c1"])
    assert served.held() == ["b1", "a1", "c1"] and len(served) == 3  # a2 went


def test_it_is_bounded_by_what_a_held_set_takes() -> None:
    served = ServedPrefixes()
    served.note(f"p{i}" for i in range(MAX_HELD + 5))
    assert len(served) == MAX_HELD and served.held()[0] == "p5"
    with pytest.raises(ValueError, match="capacity"):
        ServedPrefixes(capacity=0)


def test_the_held_set_publishes_the_served_identities_most_recent_first() -> None:
    served = ServedPrefixes()
    served.note(f"s{i}" for i in range(MAX_HELD + 10))
    running = [SimpleNamespace(identities=("r1",))]

    def no_prefix_cache() -> None:
        raise AssertionError("a vLLM worker's steps have no prefix cache to read")

    steps = SimpleNamespace(held=lambda: (running, []), prefix_state=no_prefix_cache)
    publisher = HeldPublisher(SimpleNamespace(), steps, 3000,  # type: ignore[arg-type]
                              cached=served.held)
    members = publisher.members()
    assert "r1" in members and len(members) == MAX_HELD
    assert f"s{MAX_HELD + 9}" in members and "s10" not in members  # the least recent go
