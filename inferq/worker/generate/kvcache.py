"""A slot-based KV cache for iteration-level batching, plugged into transformers' models.

Per layer, keys and values live in one preallocated tensor ``[rows, kv_heads, capacity,
head_dim]``. Each running sequence owns a row (its "slot") and its tokens sit at positions
``0..length-1`` of that row, so nothing ever shifts when other sequences join or leave:

* a decode step writes each row's new key/value at that row's own position and attends over
  ``[:n, :, :longest]`` with a mask that hides, per row, the positions past its length;
* a prefill runs the new prompts as a left-padded batch and copies each one's real part into
  the start of its row;
* a finished sequence frees its row by moving the last running row into it (one row copy), so
  the running rows are always ``0..n-1`` and a step needs no gather;
* a prefill after a prefix cache hit (``prefixcache``) first copies the cached blocks into the
  start of each row (``load_prefix``), then computes only the rest (``plan_extend``),
  attending over the whole row;
* a preempted sequence's row can be copied out to host memory (``save_row``) and back into a
  free row when it resumes (``load_row``): swapped, not recomputed.

Rows grow in steps of ``ROW_STEP`` (up to the slot limit) and capacity in steps of ``GROW``
when the running set outgrows them; ``footprint`` says, for the scheduler's KV budget, how
many token positions a set of sequences will occupy. The model calls ``update``
from every attention layer; what that call does is set by the engine before each forward
(``plan_prefill`` / ``plan_decode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from inferq.worker.models.lm import KVShape

GROW = 64
ROW_STEP = 4


def footprint(rows: int, longest: int, max_rows: int) -> int:
    """Token positions allocated for ``rows`` sequences whose longest needs ``longest``."""
    return min(-(-rows // ROW_STEP) * ROW_STEP, max_rows) * (-(-longest // GROW) * GROW)


@dataclass(slots=True)
class _Prefill:
    rows: list[int]
    lengths: list[int]
    width: int


@dataclass(slots=True)
class _Extend:
    """A prefill of sequences whose first ``starts[r]`` positions are already in their rows
    (a prefix cache hit): row ``first + r`` takes its last ``lengths[r]`` columns of the
    left-padded batch at positions ``starts[r]..``, and attention sees the rows up to
    ``kv_len``."""

    first: int
    starts: list[int]
    lengths: list[int]
    width: int
    kv_len: int


@dataclass(slots=True)
class _Decode:
    n: int
    rows: torch.Tensor
    positions: torch.Tensor
    kv_len: int


class SlotKVCache(Cache):
    def __init__(self, shape: KVShape, device: torch.device, max_rows: int) -> None:
        # Not Cache.__init__: this cache manages its own tensors instead of per-layer objects.
        self.layers = []
        self.layer_class_to_replicate = None
        self.offloading = False
        self.shape = shape
        self.device = device
        self.max_rows = max_rows
        self.rows = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._plan: _Prefill | _Extend | _Decode | None = None

    # ----------------------------------------------------------------------- storage

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def ensure(self, rows: int, tokens: int) -> None:
        """Room for ``rows`` rows of ``tokens`` positions (existing contents are kept)."""
        if rows <= self.rows and tokens <= self.capacity:
            return
        if rows > self.max_rows:
            raise ValueError(f"{rows} rows exceed the cache's {self.max_rows}")
        new_rows = max(self.rows, min(-(-rows // ROW_STEP) * ROW_STEP, self.max_rows))
        capacity = max(self.capacity, -(-tokens // GROW) * GROW)
        s = self.shape
        size = (new_rows, s.kv_heads, capacity, s.head_dim)
        new_keys, new_values = [], []
        for layer in range(s.layers):
            k = torch.zeros(size, dtype=s.dtype, device=self.device)
            v = torch.zeros(size, dtype=s.dtype, device=self.device)
            if self.capacity:
                k[: self.rows, :, : self.capacity] = self.keys[layer]
                v[: self.rows, :, : self.capacity] = self.values[layer]
            new_keys.append(k)
            new_values.append(v)
        self.keys, self.values = new_keys, new_values
        self.rows, self.capacity = new_rows, capacity

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` into row ``dst``."""
        for k, v in zip(self.keys, self.values, strict=True):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]

    def save_row(self, row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of the first ``length`` positions of ``row`` in every layer, in host memory
        (a preempted sequence's cache, swapped out; ``load_row`` puts it back)."""
        host = torch.device("cpu")
        return [(k[row, :, :length].to(host, copy=True), v[row, :, :length].to(host, copy=True))
                for k, v in zip(self.keys, self.values, strict=True)]

    def load_row(self, row: int, saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put a ``save_row`` copy into ``row`` (which ``ensure`` made room for)."""
        for (k, v), (sk, sv) in zip(zip(self.keys, self.values, strict=True), saved,
                                    strict=True):
            length = sk.shape[1]
            k[row, :, :length] = sk.to(self.device, non_blocking=True)
            v[row, :, :length] = sv.to(self.device, non_blocking=True)

    def read_block(self, row: int, start: int, end: int) -> torch.Tensor:
        """A copy of positions ``start..end`` of ``row``, every layer's keys and values:
        ``[layers, 2, kv_heads, end - start, head_dim]`` (a prefix cache entry)."""
        return torch.stack([torch.stack((k[row, :, start:end], v[row, :, start:end]))
                            for k, v in zip(self.keys, self.values, strict=True)])

    def load_prefix(self, row: int, blocks: list[torch.Tensor]) -> int:
        """Put ``read_block`` copies, in order, at the start of ``row`` (which ``ensure`` made
        room for); returns the positions filled."""
        joined = torch.cat(blocks, dim=3) if len(blocks) > 1 else blocks[0]
        length = int(joined.shape[3])
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            k[row, :, :length] = joined[layer, 0]
            v[row, :, :length] = joined[layer, 1]
        return length

    def release(self) -> None:
        """Drop the tensors (all sequences are gone); the next use reallocates small."""
        self.keys, self.values, self.rows, self.capacity = [], [], 0, 0

    # ---------------------------------------------------------------------- planning

    def plan_prefill(self, rows: list[int], lengths: list[int], width: int) -> None:
        self.ensure(max(rows) + 1, max(lengths))
        self._plan = _Prefill(rows, lengths, width)

    def plan_extend(self, first: int, starts: list[int], lengths: list[int],
                    width: int) -> int:
        """Plan a prefill of rows ``first..`` after their cached prefixes (``_Extend``);
        returns the key length attention sees."""
        kv_len = max(s + n for s, n in zip(starts, lengths, strict=True))
        self._plan = _Extend(first, starts, lengths, width, kv_len)
        return kv_len

    def plan_decode(self, positions: torch.Tensor, kv_len: int) -> None:
        """Row ``i`` (of ``0..n-1``) writes at ``positions[i]`` and sees ``0..positions[i]``;
        ``kv_len`` is ``max(positions) + 1`` (known to the caller without a device sync)."""
        n = int(positions.shape[0])
        self.ensure(n, kv_len)
        rows = torch.arange(n, device=self.device)
        self._plan = _Decode(n, rows, positions, kv_len)

    # ------------------------------------------------------------- transformers' API

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._plan
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if isinstance(plan, _Decode):
            k[plan.rows, :, plan.positions] = key_states[:, :, 0]
            v[plan.rows, :, plan.positions] = value_states[:, :, 0]
            return k[: plan.n, :, : plan.kv_len], v[: plan.n, :, : plan.kv_len]
        if isinstance(plan, _Prefill):
            # Left-padded batch: row r's real tokens are its last lengths[r] columns.
            for r, (row, length) in enumerate(zip(plan.rows, plan.lengths, strict=True)):
                k[row, :, :length] = key_states[r, :, plan.width - length:]
                v[row, :, :length] = value_states[r, :, plan.width - length:]
            return key_states, value_states
        if isinstance(plan, _Extend):
            for r, (start, length) in enumerate(zip(plan.starts, plan.lengths, strict=True)):
                row = plan.first + r
                k[row, :, start:start + length] = key_states[r, :, plan.width - length:]
                v[row, :, start:start + length] = value_states[r, :, plan.width - length:]
            rows = slice(plan.first, plan.first + len(plan.starts))
            return k[rows, :, : plan.kv_len], v[rows, :, : plan.kv_len]
        raise RuntimeError("SlotKVCache.update called without a plan")

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        plan = self._plan
        if isinstance(plan, _Decode):
            return plan.kv_len - 1
        if isinstance(plan, _Extend):
            return plan.kv_len - plan.width
        return 0

    def get_max_length(self, layer_idx: int | None = 0) -> int:
        return self.capacity

    def __len__(self) -> int:
        return self.shape.layers
