"""Pending-set score: priority first, then fair shares by cost, then arrival order.

``score = (PRIORITY_MAX - priority) * 2**SEQ_BITS + tag``. Lower scores are served first, so a
higher priority always wins. Within a priority (a *band*) the enqueue script computes
``tag = vt * 2**TIE_BITS + seq % 2**TIE_BITS``: ``vt`` is the request's virtual finish time
(``inferq.protocol.fair``: its tenant's clock advanced by cost / weight), ``seq`` a counter that
Redis increments inside the enqueue script, so equal finish times are served in arrival order
(exact for requests enqueued within ``2**TIE_BITS`` of each other on the shard). Without
tenants every request of a band is one flow whose finish times strictly grow, so the order is
FIFO. The largest score is below ``201 * 2**45 < 2**53``, where a double holds integers
exactly.
"""

from __future__ import annotations

from inferq.errors import ValidationError

PRIORITY_MIN = -100
PRIORITY_MAX = 100
#: Bits of one priority band (the tag within it).
SEQ_BITS = 45
SEQ_LIMIT: int = 1 << SEQ_BITS
#: Low bits of a tag: the arrival-order tie-break between equal virtual finish times.
TIE_BITS = 14
TIE_LIMIT: int = 1 << TIE_BITS
#: Virtual finish times are clamped below this (see ``inferq.protocol.fair``).
VT_LIMIT: int = 1 << (SEQ_BITS - TIE_BITS)


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


def encode(priority: int, tag: int) -> int:
    if not 0 <= tag < SEQ_LIMIT:
        raise ValidationError(f"tag {tag} out of range")
    return band(priority) + tag


def tag(vt: int, seq: int) -> int:
    """The in-band part of a score: virtual finish time ``vt`` (clamped below ``VT_LIMIT``),
    then the arrival-order tie-break from ``seq``."""
    return min(vt, VT_LIMIT - 1) * TIE_LIMIT + seq % TIE_LIMIT


def decode(score: float) -> tuple[int, int]:
    """(priority, tag) of a pending score."""
    s = int(score)
    return PRIORITY_MAX - s // SEQ_LIMIT, s % SEQ_LIMIT
