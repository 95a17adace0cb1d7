"""The engine's prefix cache: the KV of prompt prefixes it has computed, reused by every later
sequence whose prompt starts with them (a shared system prompt, an earlier turn of a chat).

Prompts are cut into blocks of ``BLOCK`` tokens; a block is named by a hash of its tokens and
of the name of the block before it (a chain, as in vLLM's automatic prefix caching), so a name
stands for the whole prefix up to the block's end, and a lookup walks the chain from the
first block while the cache has it. Each entry holds one block's keys and values for every
layer, ``[layers, 2, kv_heads, BLOCK, head_dim]``, on the model's device.

The cache is an LRU bounded in bytes, shared by every sequence (entries are copied into a
sequence's slot row, never shared in place, so an eviction never touches a running sequence).
A hit touches its blocks from the last to the first, so a prefix is always more recent than
the blocks that extend it and eviction takes the longest, least used extensions first: a
lookup never finds a chain with a hole. The bound is ``limit`` bytes *and* what the running
sequences leave free of the engine's KV budget (``room``, asked before each insertion and
after the slot cache grows): the cache never holds memory a running sequence needs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from inferq.protocol.prefix import MAX_HELD

#: Tokens per block: the granularity of a hit.
BLOCK = 16


def block_names(ids: Sequence[int], blocks: int) -> list[bytes]:
    """The chained names of the first ``blocks`` full blocks of ``ids``."""
    names: list[bytes] = []
    previous = b""
    for b in range(blocks):
        chunk = ids[b * BLOCK:(b + 1) * BLOCK]
        previous = hashlib.blake2b(previous + b"".join(t.to_bytes(4, "little") for t in chunk),
                                   digest_size=16).digest()
        names.append(previous)
    return names


@dataclass(slots=True)
class PrefixStats:
    #: Prompt tokens of admitted sequences, and those of them taken from the cache.
    prompt_tokens: int = 0
    reused_tokens: int = 0
    lookups: int = 0
    hits: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        """Tokens reused ÷ prompt tokens."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixCache:
    def __init__(self, limit_bytes: int, room: Callable[[], int]) -> None:
        self.limit = limit_bytes
        self.room = room
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.stats = PrefixStats()
        #: Request identities (a prompt's prefix hashes and session, computed from its text:
        #: ``inferq.protocol.prefix``) -> the blocks that end the cached prompts carrying them;
        #: an identity is held while one of those blocks is. ``version`` counts changes.
        self._held: OrderedDict[str, set[bytes]] = OrderedDict()
        self._tied: dict[bytes, set[str]] = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, ids: Sequence[int]) -> tuple[int, list[torch.Tensor]]:
        """The longest cached prefix of ``ids`` that leaves at least one token to compute:
        its length in tokens and its blocks (touched as used)."""
        names = block_names(ids, (len(ids) - 1) // BLOCK)
        found: list[bytes] = []
        for name in names:
            if name not in self.entries:
                break
            found.append(name)
        self.stats.lookups += 1
        self.stats.prompt_tokens += len(ids)
        if not found:
            return 0, []
        self.stats.hits += 1
        self.stats.reused_tokens += len(found) * BLOCK
        for name in reversed(found):
            self.entries.move_to_end(name)
        return len(found) * BLOCK, [self.entries[name] for name in found]

    def insert(self, ids: Sequence[int], length: int,
               read: Callable[[int, int], torch.Tensor]) -> int:
        """Cache the full blocks of the first ``length`` tokens of ``ids`` not cached yet;
        ``read(start, end)`` copies those positions out of the sequence's row. Returns the
        blocks added."""
        names = block_names(ids, length // BLOCK)
        added = 0
        for b, name in enumerate(names):
            if name in self.entries:
                continue
            block = read(b * BLOCK, (b + 1) * BLOCK)
            size = block.numel() * block.element_size()
            if not self._make_room(size):
                break
            self.entries[name] = block
            self.bytes += size
            added += 1
        for name in reversed(names):
            if name in self.entries:
                self.entries.move_to_end(name)
        return added

    def tie(self, identities: Sequence[str], ids: Sequence[int], length: int) -> None:
        """The prompt ``ids`` carrying ``identities`` has its first ``length`` tokens cached
        (as far as the cache holds them): each identity is held while the last cached block
        of that prompt is."""
        if not identities:
            return
        last: bytes | None = None
        for name in block_names(ids, length // BLOCK):
            if name not in self.entries:
                break
            last = name
        if last is None:
            return
        tied = self._tied.setdefault(last, set())
        for identity in identities:
            blocks = self._held.get(identity)
            if blocks is None:
                blocks = self._held[identity] = set()
                self.version += 1
            blocks.add(last)
            tied.add(identity)
            self._held.move_to_end(identity)
        while len(self._held) > MAX_HELD:
            identity, blocks = self._held.popitem(last=False)
            for name in blocks:
                self._tied.get(name, set()).discard(identity)
            self.version += 1

    def held(self) -> list[str]:
        """The identities held, most recently used last."""
        return list(self._held)

    def _untie(self, evicted: list[bytes]) -> None:
        for name in evicted:
            for identity in self._tied.pop(name, ()):
                blocks = self._held.get(identity)
                if blocks is not None:
                    blocks.discard(name)
                    if not blocks:
                        del self._held[identity]
                        self.version += 1

    def shrink(self) -> None:
        """Evict down to the bound (after the slot cache grew)."""
        self._make_room(0)

    def clear(self) -> None:
        evicted = list(self.entries)
        self.entries.clear()
        self.bytes = 0
        self._untie(evicted)

    def _bound(self) -> int:
        return max(0, min(self.limit, self.room()))

    def _make_room(self, size: int) -> bool:
        bound = self._bound()
        if size > bound:
            return False
        evicted: list[bytes] = []
        while self.bytes + size > bound and self.entries:
            name, block = self.entries.popitem(last=False)
            self.bytes -= block.numel() * block.element_size()
            evicted.append(name)
        self.stats.evicted_blocks += len(evicted)
        self._untie(evicted)
        return True
