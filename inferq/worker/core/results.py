"""Claimed requests inside a worker, and what it writes back for them.

``decode_claims`` turns what the claim script handed out into ``Claim``s; every request then
ends in one ``ops.Completion``: a result (``completion``: output, failure or retry) or an
answer without running (``failed_completion``, ``expired``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

from inferq.errors import CorruptRequest, DeadlineExceeded, InferqError, InvalidInput
from inferq.protocol import ops
from inferq.protocol.codec import (
    ErrorInfo,
    RequestPayload,
    Result,
    Status,
    decode_request,
    encode_result,
)
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.failures import Failure


@dataclass(slots=True)
class Claim:
    """A request this worker claimed, with its decoded payload."""

    claimed: ops.Claimed
    payload: RequestPayload
    #: Enqueue time and deadline on this worker's monotonic clock.
    arrival: float
    deadline: float | None
    claimed_ms: int

    @property
    def id(self) -> str:
        return self.claimed.id

    @classmethod
    def of(cls, claim: Claim, **extra: Any) -> Self:
        """``claim`` as this subclass, with the fields the subclass adds."""
        return cls(claim.claimed, claim.payload, claim.arrival, claim.deadline,
                   claim.claimed_ms, **extra)


def decode_claims(config: WorkerConfig, claimed: Sequence[ops.Claimed], now_ms: int,
                  clock: Callable[[], float]) -> tuple[list[Claim], list[ops.Completion]]:
    """Decode and check claimed payloads: the valid ones (times put on ``clock``), and a
    failed completion for each malformed one or one that belongs to another request or queue
    (each fails alone: whatever a payload makes the decoder raise, never its neighbours or the
    worker)."""
    valid: list[tuple[ops.Claimed, RequestPayload]] = []
    failures: list[ops.Completion] = []
    for c in claimed:
        try:
            payload = decode_request(c.payload, config.limits)
            if payload.id != c.id:
                raise InvalidInput(f"payload id {payload.id!r} does not match {c.id!r}")
            if (payload.task, payload.model) != (config.task, config.model_name):
                raise InvalidInput(f"payload is for {payload.task}:{payload.model}, queue is "
                                   f"{config.task}:{config.model_name}")
        except InferqError as exc:
            failures.append(failed_completion(config, c, exc, now_ms))
            continue
        except Exception as exc:  # a damaged payload fails alone
            failures.append(failed_completion(
                config, c, CorruptRequest(f"cannot decode the stored payload: "
                                          f"{type(exc).__name__}: {exc}"), now_ms))
            continue
        valid.append((c, payload))
    offset_s = now_ms / 1e3 - clock()  # Redis' clock minus ours
    return [Claim(c, payload, c.enqueued_ms / 1e3 - offset_s,
                  None if c.deadline_ms is None else c.deadline_ms / 1e3 - offset_s, now_ms)
            for c, payload in valid], failures


def completion(config: WorkerConfig, claim: Claim, outcome: Any, **fields: Any) -> ops.Completion:
    """The completion of a request that ran: ``outcome`` is its output, or its ``Failure``
    (sent back for a retry while attempts remain; else dead if retryable, failed if not).
    ``fields`` are the result's other fields (timings, sizes). An output too large to store
    becomes a failed result."""
    c = claim.claimed
    if isinstance(outcome, Failure):
        if outcome.retryable and c.attempt < claim.payload.max_attempts:
            return ops.Completion(c.id, c.token, "retry", b"", config.retry_delay_ms(c.attempt))
        status = Status.DEAD if outcome.retryable else Status.FAILED
        body: dict[str, Any] = {"error": outcome.error}
    else:
        status, body = Status.OK, {"output": outcome}
    common: dict[str, Any] = dict(
        id=c.id, task=config.task, model=config.model_name, worker=config.worker_id,
        attempts=c.attempt, enqueued_ms=c.enqueued_ms, started_ms=claim.claimed_ms, **fields)
    try:
        data = encode_result(Result(status=status, **body, **common), config.limits)
    except InferqError as exc:
        status = Status.FAILED
        data = encode_result(Result(status=status, error=ErrorInfo(code=exc.code,
                                                                   message=exc.message),
                                    **common), config.limits)
    return ops.Completion(c.id, c.token, status.value, data)


def failed_completion(config: WorkerConfig, claimed: ops.Claimed, error: InferqError,
                      now_ms: int, status: Status = Status.FAILED) -> ops.Completion:
    """A request answered without reaching the model: malformed payload, invalid input, or a
    deadline that passed while it waited in the worker (``expired``)."""
    result = Result(
        id=claimed.id, status=status,
        error=ErrorInfo(code=error.code, message=error.message[:2000]),
        task=config.task, model=config.model_name, worker=config.worker_id,
        attempts=claimed.attempt, enqueued_ms=claimed.enqueued_ms, started_ms=now_ms,
        finished_ms=now_ms,
    )
    return ops.Completion(claimed.id, claimed.token, status.value,
                          encode_result(result, config.limits))


def expired(config: WorkerConfig, claims: Sequence[Claim], now_ms: int) -> list[ops.Completion]:
    """``expired`` answers for claims whose deadline passed before they could run."""
    error = DeadlineExceeded("the deadline passed before the request could run")
    return [failed_completion(config, claim.claimed, error, now_ms, Status.EXPIRED)
            for claim in claims]

