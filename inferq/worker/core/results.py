"""Claimed requests inside a worker and what it writes back for them.

``decode_claims`` turns what the claim script handed out into ``Claim``s (payload checked,
times on the worker's clock); every request then ends in one ``ops.Completion``: a result
(``completion``: output, failure or retry) or an answer without running
(``failed_completion``, ``expired``). Both workers build their results here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from inferq.errors import DeadlineMissed, InferqError, InvalidInput
from inferq.protocol import ops
from inferq.protocol.codec import (
    ErrorInfo,
    Limits,
    RequestPayload,
    Result,
    Status,
    decode_request,
    encode_result,
)
from inferq.worker.core.failures import Failure


@dataclass(frozen=True, slots=True)
class ResultContext:
    worker: str
    task: str
    model: str
    limits: Limits
    retry_base_ms: float = 250.0
    retry_max_ms: float = 30_000.0

    def retry_delay_ms(self, attempt: int) -> int:
        """Exponential backoff with jitter: base * 2^(attempt-1), capped, times U(0.5, 1)."""
        ceiling = min(self.retry_max_ms, self.retry_base_ms * 2 ** (attempt - 1))
        return max(1, int(ceiling * random.uniform(0.5, 1.0)))


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


def decode_claims(ctx: ResultContext, claimed: Sequence[ops.Claimed], now_ms: int,
                  offset_s: float) -> tuple[list[Claim], list[ops.Completion]]:
    """Decode and check claimed payloads: the valid ones (``offset_s``: Redis' clock minus
    ours), and a failed completion for each malformed one or one that belongs to another
    request or queue (each fails alone)."""
    valid: list[Claim] = []
    failures: list[ops.Completion] = []
    for c in claimed:
        try:
            payload = decode_request(c.payload, ctx.limits)
            if payload.id != c.id:
                raise InvalidInput(f"payload id {payload.id!r} does not match {c.id!r}")
            if (payload.task, payload.model) != (ctx.task, ctx.model):
                raise InvalidInput(f"payload is for {payload.task}:{payload.model}, queue is "
                                   f"{ctx.task}:{ctx.model}")
        except InferqError as exc:
            failures.append(failed_completion(ctx, c, exc, now_ms))
            continue
        valid.append(Claim(
            claimed=c, payload=payload, arrival=c.enqueued_ms / 1e3 - offset_s,
            deadline=None if c.deadline_ms is None else c.deadline_ms / 1e3 - offset_s,
            claimed_ms=now_ms))
    return valid, failures


def completion(ctx: ResultContext, claim: Claim, outcome: Any, **fields: Any) -> ops.Completion:
    """The completion of a request that ran: ``outcome`` is its output, or its ``Failure``
    (sent back for a retry while attempts remain; else dead if retryable, failed if not).
    ``fields`` are the result's other fields (timings, sizes). An output too large to store
    becomes a failed result."""
    c = claim.claimed
    if isinstance(outcome, Failure):
        if outcome.retryable and c.attempt < claim.payload.max_attempts:
            return ops.Completion(c.id, c.token, "retry", b"", ctx.retry_delay_ms(c.attempt))
        status = Status.DEAD if outcome.retryable else Status.FAILED
        body: dict[str, Any] = {"error": outcome.error}
    else:
        status, body = Status.OK, {"output": outcome}
    common: dict[str, Any] = dict(
        id=c.id, task=ctx.task, model=ctx.model, worker=ctx.worker, attempts=c.attempt,
        enqueued_ms=c.enqueued_ms, started_ms=claim.claimed_ms, **fields)
    try:
        data = encode_result(Result(status=status, **body, **common), ctx.limits)
    except InferqError as exc:
        status = Status.FAILED
        data = encode_result(Result(status=status, error=ErrorInfo(code=exc.code,
                                                                   message=exc.message),
                                    **common), ctx.limits)
    return ops.Completion(c.id, c.token, status.value, data)


def failed_completion(ctx: ResultContext, claimed: ops.Claimed, error: InferqError,
                      now_ms: int, status: Status = Status.FAILED) -> ops.Completion:
    """A request answered without reaching the model: malformed payload, invalid input, or a
    deadline that passed while it waited in the worker (``expired``)."""
    result = Result(
        id=claimed.id, status=status,
        error=ErrorInfo(code=error.code, message=error.message[:2000]),
        task=ctx.task, model=ctx.model, worker=ctx.worker, attempts=claimed.attempt,
        enqueued_ms=claimed.enqueued_ms, started_ms=now_ms, finished_ms=now_ms,
    )
    return ops.Completion(claimed.id, claimed.token, status.value,
                          encode_result(result, ctx.limits))


def expired(ctx: ResultContext, claims: Sequence[Claim], now_ms: int) -> list[ops.Completion]:
    """``expired`` answers for claims whose deadline passed before they could run."""
    error = DeadlineMissed("the deadline passed before the request could run")
    return [failed_completion(ctx, claim.claimed, error, now_ms, Status.EXPIRED)
            for claim in claims]
