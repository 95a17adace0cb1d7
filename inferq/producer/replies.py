"""What Redis answers a producer, read: enqueue refusals (``check_full``), stored results
(``parse_result``, ``raise_for_status``, ``results_in_order``) and a request's state
(``RequestState``, ``state_of``)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, cast

from inferq.errors import (
    DeadlineExceeded,
    QueueFull,
    RequestCancelled,
    RequestFailed,
    ResultTimeout,
    ValidationError,
    WouldMissSlo,
)
from inferq.producer import admission
from inferq.producer.options import ClientOptions
from inferq.producer.prepare import Prepared
from inferq.protocol import ops, slo
from inferq.protocol.codec import Result, Status, decode_result, decode_results
from inferq.protocol.fields import HashState

#: The enqueue outcome of a request its tenant's limit refused.
TENANT_FULL = "tenant_full"
#: Enqueue outcomes that are back-pressure (the queue or the tenant at its limit): the request
#: was not queued and may be sent again later.
BACK_PRESSURE = frozenset({"full", TENANT_FULL, slo.TOKENS_FULL})


class RequestState(StrEnum):
    """Where a request is: waiting (its hash's ``fields.HashState``) or finished (its result's
    ``Status``: the same names and values, taken from there), or ``UNKNOWN``."""

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    OK = Status.OK.value
    FAILED = Status.FAILED.value
    CANCELLED = Status.CANCELLED.value
    EXPIRED = Status.EXPIRED.value
    DEAD = Status.DEAD.value
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, status: Status) -> RequestState:
        """The state of a request whose result has this status."""
        return _FINISHED[status]


#: Every ``Status`` is a finished state (a ``Status`` added without its state fails here, at
#: import); every ``HashState`` a waiting one.
_FINISHED = {status: RequestState[status.name] for status in Status}
_WAITING = {HashState.PENDING: RequestState.PENDING, HashState.INFLIGHT: RequestState.RUNNING,
            HashState.DELAYED: RequestState.RETRYING}
_WAITING_BYTES = {state.value.encode(): request_state for state, request_state in _WAITING.items()}


def check_full(reply: ops.EnqueueReply, prepared: Prepared, options: ClientOptions) -> None:
    late = slo.late_ms(reply.outcomes[0]) if reply.outcomes else None
    if late is not None:
        raise WouldMissSlo(
            f"request refused: predicted {late} ms to its result on queue "
            f"{prepared.keys.queue}, its objective is {prepared.item.slo_ms} ms; retry after "
            f"{reply.retry_after_ms / 1e3:.1f} s", predicted_ms=late,
            slo_ms=prepared.item.slo_ms, depth=reply.depth,
            retry_after_s=reply.retry_after_ms / 1e3)
    if reply.outcomes == [slo.TOKENS_FULL]:
        raise admission.tokens_full(prepared.keys.queue, prepared.item.cost,
                                    prepared.item.policy, reply.depth, reply.retry_after_ms)
    if reply.outcomes == [TENANT_FULL]:
        raise QueueFull(
            f"tenant {prepared.item.tenant!r} is at its limit of "
            f"{prepared.item.tenant_limit} unfinished requests on queue "
            f"{prepared.keys.queue}; retry after {reply.retry_after_ms / 1e3:.1f} s",
            depth=reply.depth, max_depth=prepared.item.tenant_limit,
            retry_after_s=reply.retry_after_ms / 1e3, tenant=prepared.item.tenant)
    if reply.outcomes and all(o == "full" for o in reply.outcomes):
        raise QueueFull(
            f"queue {prepared.keys.queue} is full for this priority ({reply.depth} pending, "
            f"limit {prepared.item.depth_limit}); retry after "
            f"{reply.retry_after_ms / 1e3:.1f} s",
            depth=reply.depth, max_depth=prepared.item.depth_limit,
            retry_after_s=reply.retry_after_ms / 1e3,
        )


def raise_for_status(result: Result) -> Result:
    """Return an ok result; raise the typed error that matches any other outcome."""
    if result.status is Status.OK:
        return result
    message = result.error.message if result.error else result.status.value
    code = result.error.code if result.error else result.status.value
    text = f"request {result.id} {result.status.value}: [{code}] {message}"
    if result.status is Status.CANCELLED:
        raise RequestCancelled(text, result=result)
    if result.status is Status.EXPIRED:
        raise DeadlineExceeded(text, result=result)
    raise RequestFailed(text, result=result)


def results_in_order(ids: Sequence[str], raws: Sequence[Any], options: ClientOptions,
                     timeout: float | None) -> list[Result]:
    """``results()``: every raw result parsed, in order, or ``ResultTimeout`` naming how many
    are missing."""
    results = parse_results(raws, options)
    missing = [request_id for request_id, r in zip(ids, results, strict=True) if r is None]
    if missing:
        raise ResultTimeout(f"{len(missing)} of {len(ids)} results missing after {timeout} s "
                            f"(the first: request {missing[0]})")
    return cast("list[Result]", results)


def parse_results(raws: Sequence[Any], options: ClientOptions) -> list[Result | None]:
    """``parse_result`` of each (one pydantic call for all of them; only when that refuses
    one is each parsed alone, which raises what ``parse_result`` raises)."""
    datas = [raw.encode() if isinstance(raw, str) else bytes(raw)
             for raw in raws if raw is not None]
    try:
        decoded = iter(decode_results(datas, options.limits))
    except ValidationError:
        return [parse_result(raw, options) for raw in raws]
    return [None if raw is None else next(decoded) for raw in raws]


def parse_result(raw: Any, options: ClientOptions) -> Result | None:
    if raw is None:
        return None
    return decode_result(raw.encode() if isinstance(raw, str) else bytes(raw), options.limits)


def state_of(hash_state: bytes | None, raw_result: bytes | None,
             options: ClientOptions) -> RequestState:
    """A request's state from its hash's ``Field.STATE`` and its stored result (either may be
    None)."""
    if raw_result is not None:
        return RequestState.of(decode_result(raw_result, options.limits).status)
    return _WAITING_BYTES.get(hash_state or b"", RequestState.UNKNOWN)
