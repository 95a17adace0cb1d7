"""Dead letters an operator can act on: list, show, requeue, purge.

A request that used all its attempts ends ``dead``: its id goes to the shard's capped
``dead`` set (scored by when it died) and a record of it (its hash's fields, the payload
among them, with the error) to the ``dead_letters`` hash (``lua/includes/graves.lua``).
Requeue and purge are Lua scripts (``requeue.lua``, ``purge.lua``): atomic per call and
idempotent (an id no longer in the dead set is left alone). Selecting what to act on reads
the set page by page (``ZRANGE ... BYSCORE REV LIMIT``), never ``KEYS``, then fetches the
records of each page (``HMGET``).

Every reading and action is a plan (``inferq.plans``), so the sync SDK (``Client``), the
async one (the gateway's admin routes) and the CLI share one description.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import msgpack

from inferq.errors import ValidationError
from inferq.plans import Do, Plan, call
from inferq.protocol import ops, scores
from inferq.protocol.codec import decode_request
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys
from inferq.stats import shard_keys

#: Ids read per ``ZRANGE`` page, and sent per script call.
PAGE = 500
#: The stats hash's dead-letter counters (written by the scripts).
COUNTERS = ("dead_cap", "dead_dropped", "dead_requeued", "dead_purged")


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters: all of these that are given must hold. ``ids``: only these;
    ``error_code``: the code of their error; ``older_than_s``: dead for longer than this
    (Redis clock); ``limit``: at most this many, newest first."""

    ids: tuple[str, ...] = ()
    error_code: str | None = None
    older_than_s: float | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (isinstance(self.limit, bool) or self.limit < 1):
            raise ValidationError(f"limit must be an integer >= 1, got {self.limit!r}")
        if self.older_than_s is not None and not self.older_than_s >= 0:
            raise ValidationError(f"older_than_s must be >= 0 seconds, got {self.older_than_s}")
        if any(not isinstance(i, str) or not i for i in self.ids):
            raise ValidationError(f"ids must be non-empty strings, got {self.ids!r}")

    @property
    def narrows(self) -> bool:
        """Whether it selects less than every dead letter (the CLI asks for ``--all``)."""
        return bool(self.ids) or self.error_code is not None or self.older_than_s is not None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    queue: str
    shard: int
    #: When it was dead-lettered (ms, Redis clock).
    died_ms: int
    error_code: str
    error_message: str
    attempts: int
    priority: int | None = None
    max_attempts: int | None = None
    enqueued_ms: int | None = None
    #: The request hash's other fields as it died (a tenant, for example), as text.
    extra: dict[str, str] = field(default_factory=dict)
    #: Its payload (msgpack); None when no record was kept (dead-lettered by an older inferq).
    payload: bytes | None = None

    @property
    def requeueable(self) -> bool:
        return self.payload is not None

    def prompt_head(self, chars: int = 80) -> str | None:
        """The start of its prompt (or of its last message), or None if unreadable."""
        if self.payload is None:
            return None
        try:
            request = decode_request(self.payload)
        except Exception:  # a damaged payload is shown as such, never raised here
            return None
        text = request.prompt or (request.messages[-1].content if request.messages else "")
        text = str(text)
        return text if len(text) <= chars else text[: chars - 1] + "…"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("payload")
        data["requeueable"] = self.requeueable
        data["prompt_head"] = self.prompt_head()
        return data


@dataclass(frozen=True, slots=True)
class DeadLetterReport:
    """The selected dead letters, with the queue's dead-letter totals."""

    queue: str
    letters: list[DeadLetter]
    #: Dead letters in the set now (every shard).
    total: int
    #: The cap the workers apply (None until one dead-lettered something).
    cap: int | None
    #: Fell off the cap (oldest first), requeued and purged, since the queue was created.
    dropped: int
    requeued: int
    purged: int

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "total": self.total, "cap": self.cap,
                "dropped": self.dropped, "requeued": self.requeued, "purged": self.purged,
                "letters": [letter.as_dict() for letter in self.letters]}


@dataclass(frozen=True, slots=True)
class ActionReport:
    """What a requeue or purge did: the ids by outcome (``requeued``, ``purged``,
    ``absent``, ``live``, ``no_record``)."""

    queue: str
    action: str
    outcomes: dict[str, list[str]]

    def count(self, outcome: str) -> int:
        return len(self.outcomes.get(outcome, []))

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "action": self.action,
                "counts": {k: len(v) for k, v in self.outcomes.items()},
                "outcomes": self.outcomes}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int | None:
    try:
        return int(float(_text(value)))
    except (TypeError, ValueError):
        return None


def parse_record(keys: QueueKeys, request_id: str, died_ms: int, raw: Any) -> DeadLetter:
    """A dead letter from its record (``graves.lua``); a missing or unreadable record gives
    one without payload, its error unknown."""
    try:
        record = msgpack.unpackb(raw, raw=True) if raw is not None else None
    except Exception:  # an unreadable record: shown as such
        record = None
    if not isinstance(record, dict):
        return DeadLetter(request_id, keys.queue, keys.shard, died_ms, "", "", 0)
    flat = record.get(b"h") or []
    hashed = {_text(k): v for k, v in zip(flat[::2], flat[1::2], strict=False)}
    payload = hashed.pop(Field.PAYLOAD.value, None)
    score = _int(hashed.pop(Field.SCORE.value, None))
    known = {f.value for f in Field}
    return DeadLetter(
        id=request_id, queue=keys.queue, shard=keys.shard, died_ms=died_ms,
        error_code=_text(record.get(b"code", b"")),
        error_message=_text(record.get(b"message", b"")),
        attempts=_int(record.get(b"attempts", 0)) or 0,
        priority=scores.decode(score)[0] if score is not None else None,
        max_attempts=_int(hashed.get(Field.MAX_ATTEMPTS.value)),
        enqueued_ms=_int(hashed.get(Field.ENQUEUED.value)),
        extra={k: _text(v) for k, v in hashed.items() if k not in known},
        payload=bytes(payload) if isinstance(payload, bytes | bytearray) else None,
    )


def _now_ms() -> Plan[int]:
    (now,) = yield [call("execute_command", "TIME")]
    return int(now[0]) * 1000 + int(now[1]) // 1000


def _shard_letters(keys: QueueKeys, flt: DeadLetterFilter, now_ms: int,
                   want: int | None) -> Plan[list[DeadLetter]]:
    """The dead letters of one shard that pass ``flt``, newest first, at most ``want``."""
    found: list[DeadLetter] = []
    if flt.ids:
        ids = list(dict.fromkeys(flt.ids))
        died = yield [call("zscore", keys.dead, i) for i in ids]
        present = [(i, int(d)) for i, d in zip(ids, died, strict=True) if d is not None]
        if flt.older_than_s is not None:
            cutoff = now_ms - flt.older_than_s * 1000
            present = [(i, d) for i, d in present if d < cutoff]
        if present:
            (raws,) = yield [call("hmget", keys.dead_letters, *[i for i, _ in present])]
            found = [parse_record(keys, i, d, raw)
                     for (i, d), raw in zip(present, raws, strict=True)]
        found = [x for x in found if flt.error_code in (None, x.error_code)]
        found.sort(key=lambda x: -x.died_ms)
        return found if want is None else found[:want]
    top = "+inf" if flt.older_than_s is None else f"({now_ms - flt.older_than_s * 1000:.0f}"
    offset = 0
    while want is None or len(found) < want:
        (page,) = yield [call("zrange", keys.dead, top, "-inf", desc=True, byscore=True,
                              offset=offset, num=PAGE, withscores=True)]
        if not page:
            break
        offset += len(page)
        ids = [_text(m) for m, _ in page]
        (raws,) = yield [call("hmget", keys.dead_letters, *ids)]
        for (member, died), raw in zip(page, raws, strict=True):
            letter = parse_record(keys, _text(member), int(died), raw)
            if flt.error_code in (None, letter.error_code):
                found.append(letter)
        if len(page) < PAGE:
            break
    return found if want is None else found[:want]


def select(keys: QueueKeys, flt: DeadLetterFilter) -> Plan[list[DeadLetter]]:
    """The dead letters of every shard of the queue that pass ``flt``, newest first."""
    shards = yield from shard_keys(keys)
    now_ms = yield from _now_ms()
    letters: list[DeadLetter] = []
    for shard in shards:
        letters += yield from _shard_letters(shard, flt, now_ms, flt.limit)
    letters.sort(key=lambda x: -x.died_ms)
    return letters if flt.limit is None else letters[: flt.limit]


def report(keys: QueueKeys, flt: DeadLetterFilter) -> Plan[DeadLetterReport]:
    """``select`` plus the queue's dead-letter totals (the cap and what fell off it)."""
    letters = yield from select(keys, flt)
    shards = yield from shard_keys(keys)
    replies = yield [c for shard in shards for c in (
        call("zcard", shard.dead), call("hmget", shard.stats, *COUNTERS))]
    total, sums, cap = 0, dict.fromkeys(COUNTERS, 0), None
    for size, counters in zip(replies[::2], replies[1::2], strict=True):
        total += int(size)
        for name, value in zip(COUNTERS, counters, strict=True):
            number = _int(value) if value is not None else None
            if number is None:
                continue
            if name == "dead_cap":
                cap = number if cap is None else max(cap, number)
            else:
                sums[name] += number
    return DeadLetterReport(keys.queue, letters, total, cap, sums["dead_dropped"],
                            sums["dead_requeued"], sums["dead_purged"])


def _act(keys: QueueKeys, flt: DeadLetterFilter, action: str,
         scripts: Mapping[str, Any]) -> Plan[ActionReport]:
    letters = yield from select(keys, flt)
    outcomes: dict[str, list[str]] = {}
    if flt.ids:  # ids asked for that are not dead letters (any more): say so
        chosen = {x.id for x in letters}
        absent = [i for i in dict.fromkeys(flt.ids) if i not in chosen]
        if absent and flt.error_code is None and flt.older_than_s is None:
            outcomes["absent"] = absent
    by_shard: dict[int, list[str]] = {}
    for letter in letters:
        by_shard.setdefault(letter.shard, []).append(letter.id)
    script = scripts[action]
    for shard, ids in sorted(by_shard.items()):
        shard_keys_ = keys.for_shard(shard)
        for start in range(0, len(ids), PAGE):
            chunk = ids[start:start + PAGE]
            k, a = (ops.requeue_call if action == "requeue" else ops.purge_call)(
                shard_keys_, chunk)
            reply = yield Do(partial(script, keys=k, args=a))
            for request_id, outcome in zip(chunk, reply, strict=True):
                outcomes.setdefault(_text(outcome), []).append(request_id)
    return ActionReport(keys.queue, action, outcomes)


def requeue(keys: QueueKeys, flt: DeadLetterFilter,
            scripts: Mapping[str, Any]) -> Plan[ActionReport]:
    """Requeue the dead letters ``flt`` selects (``requeue.lua``: same id, score and tenant,
    attempts reset); ids by outcome."""
    return (yield from _act(keys, flt, "requeue", scripts))


def purge(keys: QueueKeys, flt: DeadLetterFilter,
          scripts: Mapping[str, Any]) -> Plan[ActionReport]:
    """Purge the dead letters ``flt`` selects (``purge.lua``); ids by outcome."""
    return (yield from _act(keys, flt, "purge", scripts))


def ids_filter(ids: Iterable[str]) -> DeadLetterFilter:
    return DeadLetterFilter(ids=tuple(ids))
