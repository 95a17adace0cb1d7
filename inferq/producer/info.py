"""What a producer can learn about one request besides its result: ``Handle.info()`` (read
in one pipelined round trip, HMGET of the request hash and LINDEX of the result: see
``producer.handle``) and the outcome of ``Handle.cancel()``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from inferq.producer.options import ClientOptions
from inferq.producer.replies import RequestState, parse_result, state_of
from inferq.protocol.codec import Result
from inferq.protocol.fields import Field
from inferq.protocol.ops import as_str


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

    #: The request hash's fields it is read from.
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field.STATE, Field.ATTEMPTS, Field.MAX_ATTEMPTS, Field.OWNER, Field.ENQUEUED,
        Field.CLAIMED, Field.DEADLINE)


def _int(value: Any) -> int | None:
    return None if value is None or as_str(value) == "" else int(float(as_str(value)))


def as_info(request_id: str, replies: list[Any], options: ClientOptions) -> RequestInfo:
    """The info from the replies of HMGET ``RequestInfo.FIELDS`` and LINDEX of the result."""
    values, raw = replies
    fields = dict(zip(RequestInfo.FIELDS, values, strict=True))
    result = parse_result(raw, options)
    owner = fields[Field.OWNER]
    enqueued, claimed = fields[Field.ENQUEUED], fields[Field.CLAIMED]
    return RequestInfo(
        id=request_id, state=state_of(fields[Field.STATE], raw, options),
        attempts=result.attempts if result is not None else _int(fields[Field.ATTEMPTS]) or 0,
        max_attempts=_int(fields[Field.MAX_ATTEMPTS]),
        owner=as_str(owner) if owner is not None else (result.worker if result else None),
        enqueued_ms=_int(enqueued) if enqueued is not None else (
            result.enqueued_ms if result else None),
        claimed_ms=_int(claimed) if claimed is not None else (
            result.started_ms if result else None),
        deadline_ms=_int(fields[Field.DEADLINE]),
        finished_ms=result.finished_ms if result else None,
        result=result,
    )
