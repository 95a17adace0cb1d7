"""What a producer can ask about one request besides its result: ``Handle.info()`` and the
outcome of ``Handle.cancel()``. Read-only: one pipelined round trip (HMGET of the request
hash, LINDEX of the result), no script."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from operator import methodcaller
from typing import Any

from inferq.producer.common import ClientOptions, RequestState, parse_result, state_of
from inferq.protocol.codec import Result
from inferq.protocol.keys import QueueKeys
from inferq.protocol.ops import as_str

#: Request-hash fields read by ``info`` (see ``inferq.protocol.scripts``).
FIELDS = ("st", "a", "ma", "o", "eq", "cl", "dl")


class CancelOutcome(StrEnum):
    """What ``cancel()`` did. Truthy only for ``CANCELLED`` (this call cancelled it), so
    ``if handle.cancel():`` reads as before."""

    CANCELLED = "cancelled"
    #: It had already finished (ok, failed, cancelled, expired): nothing changed.
    DONE = "done"
    #: No such request in this queue (never enqueued, or its result has expired).
    UNKNOWN = "unknown"

    def __bool__(self) -> bool:
        return self is CancelOutcome.CANCELLED

    @classmethod
    def parse(cls, reply: Any) -> CancelOutcome:
        return cls(as_str(reply))


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A request's state and bookkeeping. Times are Redis-clock milliseconds since the epoch;
    ``owner`` is the worker running it (or that last ran it)."""

    id: str
    state: RequestState
    attempts: int
    max_attempts: int | None
    owner: str | None
    enqueued_ms: int | None
    claimed_ms: int | None
    deadline_ms: int | None
    finished_ms: int | None
    #: The stored result once finished, else None.
    result: Result | None


def commands(keys: QueueKeys, request_id: str) -> list[methodcaller]:
    return [methodcaller("hmget", keys.request(request_id), *FIELDS),
            methodcaller("lindex", keys.result(request_id), 0)]


def _int(value: Any) -> int | None:
    return None if value is None or as_str(value) == "" else int(float(as_str(value)))


def parse(request_id: str, replies: list[Any], options: ClientOptions) -> RequestInfo:
    values, raw = replies
    fields = dict(zip(FIELDS, values, strict=True))
    result = parse_result(raw, options)
    state = state_of(fields["st"], raw, options)
    owner = fields["o"]
    return RequestInfo(
        id=request_id, state=state,
        attempts=result.attempts if result is not None else _int(fields["a"]) or 0,
        max_attempts=_int(fields["ma"]),
        owner=as_str(owner) if owner is not None else (result.worker if result else None),
        enqueued_ms=_int(fields["eq"]) if fields["eq"] is not None else (
            result.enqueued_ms if result else None),
        claimed_ms=_int(fields["cl"]) if fields["cl"] is not None else (
            result.started_ms if result else None),
        deadline_ms=_int(fields["dl"]),
        finished_ms=result.finished_ms if result else None,
        result=result,
    )
