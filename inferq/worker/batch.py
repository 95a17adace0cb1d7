"""A claimed request inside the worker, a batch of them, and the results they produce."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferq.errors import InferqError, InvalidInput
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
from inferq.worker.isolation import Failure
from inferq.worker.models.base import ModelInput
from inferq.worker.policy import ReleaseReason


@dataclass(slots=True)
class Job:
    claimed: ops.Claimed
    payload: RequestPayload
    input: ModelInput
    #: Enqueue time and deadline on this worker's monotonic clock.
    arrival: float
    deadline: float | None
    claimed_ms: int

    @property
    def id(self) -> str:
        return self.claimed.id

    @property
    def tokens(self) -> int:
        return self.input.tokens


@dataclass(slots=True)
class Batch:
    id: int
    jobs: list[Job]
    reason: ReleaseReason
    padding_efficiency: float
    released_at: float
    extra: dict[str, Any] = field(default_factory=dict)


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


def job_result(ctx: ResultContext, job: Job, outcome: Any, *, batch_size: int,
               finished_ms: int, compute_ms: float) -> ops.Completion:
    """The completion for one job; an output too large to store becomes a failed result."""
    common: dict[str, Any] = dict(
        id=job.id, task=ctx.task, model=ctx.model, worker=ctx.worker,
        attempts=job.claimed.attempt, batch_size=batch_size, input_tokens=job.tokens,
        enqueued_ms=job.claimed.enqueued_ms, started_ms=job.claimed_ms,
        finished_ms=finished_ms, compute_ms=round(compute_ms, 3),
    )
    if isinstance(outcome, Failure):
        if outcome.retryable and job.claimed.attempt < job.payload.max_attempts:
            return ops.Completion(job.id, job.claimed.token, "retry", b"",
                                  ctx.retry_delay_ms(job.claimed.attempt))
        status = Status.DEAD if outcome.retryable else Status.FAILED
        result = Result(status=status, error=outcome.error, **common)
    else:
        result = Result(status=Status.OK, output=outcome, **common)
    try:
        body = encode_result(result, ctx.limits)
    except InferqError as exc:
        result = Result(status=Status.FAILED,
                        error=ErrorInfo(code=exc.code, message=exc.message), **common)
        body = encode_result(result, ctx.limits)
    return ops.Completion(job.id, job.claimed.token, result.status.value, body)


def failed_completion(ctx: ResultContext, claimed: ops.Claimed, error: InferqError,
                      now_ms: int, status: Status = Status.FAILED) -> ops.Completion:
    """A request answered without reaching the model: malformed payload, invalid input, or a
    deadline that passed while it waited in the worker's window (``expired``)."""
    result = Result(
        id=claimed.id, status=status,
        error=ErrorInfo(code=error.code, message=error.message[:2000]),
        task=ctx.task, model=ctx.model, worker=ctx.worker, attempts=claimed.attempt,
        enqueued_ms=claimed.enqueued_ms, started_ms=now_ms, finished_ms=now_ms,
    )
    return ops.Completion(claimed.id, claimed.token, status.value,
                          encode_result(result, ctx.limits))


def decode_claims(ctx: ResultContext, claimed: Sequence[ops.Claimed], now_ms: int
                  ) -> tuple[list[tuple[ops.Claimed, RequestPayload]], list[ops.Completion]]:
    """Decode and check claimed payloads: the valid ones, and a failed completion for each
    malformed one or one that belongs to another request or queue (each fails alone)."""
    valid: list[tuple[ops.Claimed, RequestPayload]] = []
    failures: list[ops.Completion] = []
    for c in claimed:
        try:
            payload = decode_request(c.payload, ctx.limits)
            if payload.id != c.id:
                raise InvalidInput(f"payload id {payload.id!r} does not match {c.id!r}")
            if (payload.task, payload.model) != (ctx.task, ctx.model):
                raise InvalidInput(f"payload is for {payload.task}:{payload.model}, queue is "
                                   f"{ctx.task}:{ctx.model}")
            valid.append((c, payload))
        except InferqError as exc:
            failures.append(failed_completion(ctx, c, exc, now_ms))
    return valid, failures
