"""The one source of the names stored inside a request's Redis keys: the fields of its hash,
the states that hash can be in, and the fields of its stream entries.

Python reads these enums; the Lua scripts get the same names as ``local`` constants that the
loader (``inferq.protocol.scripts``) generates from this module and puts in front of every
script (``lua_constants``). A test (``tests/unit/test_script_headers.py``) fails if a script or
a Python module spells one of these names as a literal instead. To add or rename a field, edit
this module only.
"""

from __future__ import annotations

from enum import StrEnum


class Field(StrEnum):
    """The fields of a request hash ``<prefix>req:<id>``. It exists exactly until the
    request's result is written (the script that writes a result deletes it)."""

    #: The msgpack payload (``codec.RequestPayload``).
    PAYLOAD = "p"
    #: The pending score: ``(100 - priority)·2^45 + tag`` (``scores``).
    SCORE = "s"
    #: Where the request waits: a ``HashState``.
    STATE = "st"
    #: Attempts used by runs that failed (the model raised, the request timed out) and were
    #: retried; a run in progress is attempt ``a + 1``. A run lost with its worker is not an
    #: attempt: it counts in ``LOST``.
    ATTEMPTS = "a"
    MAX_ATTEMPTS = "ma"
    #: Runs lost with their worker (it vanished while running the request); absent: none.
    LOST = "l"
    #: Of those, the runs lost while the request ran alone (the evidence that it crashes
    #: workers); at the reclaim's crash limit it is dead-lettered ``crashed_worker``.
    CRASHES = "x"
    #: The largest batch the request may run in next (bisection of a crashed batch: half the
    #: batch it was lost in; 1: it runs alone); absent: no limit.
    CAP = "bc"
    #: Enqueue time (ms, Redis clock).
    ENQUEUED = "eq"
    #: Absolute deadline (ms, Redis clock); absent without one.
    DEADLINE = "dl"
    #: The reply inbox of the client that enqueued it; absent without one.
    REPLY_TO = "rt"
    #: The worker holding its lease, while in flight. (The lease's token, the proof that no
    #: result exists yet, is in the shard's ``leases`` hash: ``QueueKeys.leases``.)
    OWNER = "o"
    #: The time of the current claim (ms, Redis clock).
    CLAIMED = "cl"
    #: The tenant that sent it (``inferq.protocol.fair``); absent without one.
    TENANT = "tn"
    #: What its tenant's fair-share clock was charged at enqueue, ``"<band level> <epoch>
    #: <weight> <cost>"``, so that its completion can give back what it did not use
    #: (``inferq.protocol.fair``); absent without a tenant or when it was ordered by deadline.
    CHARGE = "fc"
    #: The estimated tokens the request counts in its band's queued tokens while it is
    #: pending (``inferq queue set --max-queued-tokens``: ``lua/includes/queued.lua``);
    #: absent: not counted (enqueued while the queue had no bound).
    QUEUED = "qt"
    #: The ms to its result (first token) admission by prediction predicted when it admitted
    #: the request; absent: none made. The worker measures the actual time against it.
    PREDICTED = "pw"
    #: Cache affinity (``inferq.protocol.prefix``): the identity of its session, and its
    #: prompt's prefix hash chain (space-separated, shortest prefix first); absent: none.
    SESSION = "ss"
    PREFIXES = "px"
    #: When a claim under cache affinity first passed it over (ms, Redis clock): it is due,
    #: taken before any preference, ``affinity_max_wait_ms`` later. Absent: never passed over.
    SKIPPED = "sk"


class HashState(StrEnum):
    """The values of ``Field.STATE``: a request that has no result yet."""

    PENDING = "pending"
    INFLIGHT = "inflight"
    #: Waiting in the delayed set for its retry backoff to end.
    DELAYED = "delayed"


class StreamField(StrEnum):
    """The fields of an entry of a generation's stream ``<prefix>stream:<id>``."""

    #: The attempt that wrote the entry.
    ATTEMPT = "a"
    #: The text delta.
    TEXT = "d"
    #: The ids of the tokens behind the delta (decimal, space-separated).
    TOKENS = "k"
    #: 1: the end marker (the result exists).
    END = "e"


def lua_constants() -> str:
    """The Lua ``local`` declarations of every name above (``F_STATE = 'st'``,
    ``STATE_PENDING = 'pending'``, ``SF_TEXT = 'd'``): locals, so a script pays nothing to use
    them."""
    lines = ["-- generated from inferq/protocol/fields.py: edit the names there"]
    for prefix, enum in (("F_", Field), ("STATE_", HashState), ("SF_", StreamField)):
        names = [prefix + member.name for member in enum]
        values = [f"'{member.value}'" for member in enum]
        lines.append(f"local {', '.join(names)} = {', '.join(values)}")
    return "\n".join(lines) + "\n"
