"""The prefix identities a worker has served, for an engine whose prefix cache inferq cannot
read (``--engine vllm``: vLLM's automatic prefix caching keeps its blocks to itself).

vLLM caches the KV blocks of the prompts it ran and evicts them least recently used; the
identities of the prompts a worker ran most recently are the best guess of what its cache
still holds. So the worker notes every request it starts (``note``), and its held set
(``affinity.HeldPublisher``) publishes these, most recent first, in place of a prefix cache's
own list. It is a guess: vLLM may have evicted a prefix still listed (the claim then only
places a request where its prefix is no longer cached, as a plain claim could) and a bounded
list forgets what vLLM may still hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from inferq.protocol.prefix import MAX_HELD


class ServedPrefixes:
    """A bounded LRU of identities (``inferq.protocol.prefix``: prefix hashes and sessions)."""

    def __init__(self, capacity: int = MAX_HELD) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def note(self, identities: Iterable[str]) -> None:
        """A request with these identities started: they become the most recently used, and
        the least recently used beyond ``capacity`` are forgotten."""
        for identity in identities:
            self._ids[identity] = None
            self._ids.move_to_end(identity)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def held(self) -> list[str]:
        """The identities, least recently used first (as ``PrefixCache.held`` orders them)."""
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)
