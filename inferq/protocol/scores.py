"""Pending-set score: priority first, then arrival order.

``score = (PRIORITY_MAX - priority) * 2**SEQ_BITS + seq``. Lower scores are served first, so a
higher priority wins and, within a priority, the smaller sequence number (earlier enqueue) wins.
``seq`` comes from a counter that Redis increments inside the enqueue script, so FIFO order is
exact and independent of producers' clocks. The largest score is below 2**49, well inside the
2**53 range where a double holds integers exactly.
"""

from __future__ import annotations

from inferq.errors import ValidationError

PRIORITY_MIN = -100
PRIORITY_MAX = 100
SEQ_BITS = 40
SEQ_LIMIT: int = 1 << SEQ_BITS


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError(f"priority must be an integer, got {priority!r}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValidationError(
            f"priority must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority}"
        )
    return priority


def band(priority: int) -> int:
    """The score's high part for ``priority`` (passed to the enqueue script)."""
    level: int = check_priority(priority)
    return (PRIORITY_MAX - level) * SEQ_LIMIT


def encode(priority: int, seq: int) -> int:
    if not 0 <= seq < SEQ_LIMIT:
        raise ValidationError(f"sequence {seq} out of range")
    return band(priority) + seq


def decode(score: float) -> tuple[int, int]:
    """(priority, seq) of a pending score."""
    s = int(score)
    return PRIORITY_MAX - s // SEQ_LIMIT, s % SEQ_LIMIT
