"""How many of the worker's slots can take a new sequence, from vLLM's scheduler state.

vLLM accepts any number of requests and queues what it cannot run in its own memory; inferq's
backlog must stay in Redis instead, in priority order, where every worker sees it. So the
worker claims only for room vLLM has now: a slot (``max_num_seqs``) that no running or waiting
request of vLLM holds, and KV cache to spare. When vLLM has requests waiting (it ran out of KV
blocks and preempted some, or could not schedule them) or its KV cache is at least
``KV_HIGH_WATERMARK`` full, no slot is offered: the sequences in hand must first finish.
"""

from __future__ import annotations

from dataclasses import dataclass

#: KV cache usage (0..1) at and above which the worker claims nothing more.
KV_HIGH_WATERMARK = 0.9


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """vLLM's scheduler after its last step (``SchedulerStats``)."""

    running: int = 0
    waiting: int = 0
    #: Fraction of the KV cache's blocks in use.
    kv_usage: float = 0.0


def usable_slots(max_slots: int, held: int, state: SchedulerState) -> int:
    """Slots the step loop may fill: all ``max_slots``, or only the ``held`` sequences it already
    gave vLLM when vLLM has no room for more (requests waiting, KV cache nearly full)."""
    if state.waiting > 0 or state.kv_usage >= KV_HIGH_WATERMARK:
        return min(held, max_slots)
    return max_slots
