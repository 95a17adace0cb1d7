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

A queue whose order is ``deadline`` (``inferq queue set --order deadline``) splits each band's
45 bits in two halves, so the band (and so priority) is untouched::

    tag < 2**44   requests with a latency objective (``ttft_slo_ms``), earliest deadline
                  first: (deadline_ms - base) * 2**DEADLINE_TIE_BITS + seq % 2**DEADLINE_TIE_BITS
    tag >= 2**44  requests without one, in fair order as above, vt clamped below 2**30:
                  2**44 + vt * 2**TIE_BITS + seq % 2**TIE_BITS

``deadline_ms`` is absolute on the Redis clock (enqueue time + objective); ``base`` is the
band's deadline base in the shard's fair hash (``d:<level>``), reset to the enqueue time
whenever none of the band's first half is pending, so offsets start near 0 and 36 bits of ms
(about 795 days of a band never empty of deadlines) fit; beyond that they clamp (FIFO among
the clamped). Equal deadlines (same ms) keep arrival order for 256 arrivals.
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
#: Deadline order (see the module docstring): the first half of a band holds requests with an
#: objective, by deadline; the second those without, in fair order.
DEADLINE_SPLIT: int = 1 << (SEQ_BITS - 1)
DEADLINE_TIE_BITS = 8
DEADLINE_TIE_LIMIT: int = 1 << DEADLINE_TIE_BITS
#: Deadline offsets (ms from the band's base) are clamped below this.
DEADLINE_OFFSET_LIMIT: int = DEADLINE_SPLIT >> DEADLINE_TIE_BITS
#: Virtual finish times of the second half are clamped below this.
DEADLINE_VT_LIMIT: int = DEADLINE_SPLIT >> TIE_BITS
#: The longest latency objective (``ttft_slo_ms``): one day.
MAX_SLO_MS = 86_400_000


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


def deadline_tag(offset_ms: int, seq: int) -> int:
    """The in-band part of a score under deadline order, for a request with an objective due
    ``offset_ms`` after its band's base (clamped to ``[0, DEADLINE_OFFSET_LIMIT)``)."""
    offset = min(max(offset_ms, 0), DEADLINE_OFFSET_LIMIT - 1)
    return offset * DEADLINE_TIE_LIMIT + seq % DEADLINE_TIE_LIMIT


def decode(score: float) -> tuple[int, int]:
    """(priority, tag) of a pending score."""
    s = int(score)
    return PRIORITY_MAX - s // SEQ_LIMIT, s % SEQ_LIMIT
