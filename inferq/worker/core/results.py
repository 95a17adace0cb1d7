"""Claimed requests inside a worker, and what it writes back for them.

``decode_claims`` turns what the claim script handed out into ``Claim``s; every request then
ends in one ``ops.Completion``: a result (``completion``: output, failure or retry) or an
answer without running (``failed_completion``, ``expired``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import msgpack

from inferq.errors import CorruptRequest, DeadlineExceeded, InferqError, InvalidInput
from inferq.protocol import ops, slo
from inferq.protocol.codec import (
    WIRE_VERSION,
    ErrorInfo,
    RequestPayload,
    Result,
    Status,
    Usage,
    decode_request,
    decode_requests,
    encode_result,
    encode_result_fields,
)
from inferq.tracing import trace_id_of
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


def ran_before(claimed: ops.Claimed) -> bool:
    """A request that ran before: its run failed and was retried, or was lost with its
    worker (a generation goes on from its streamed tokens)."""
    return claimed.attempt >= 2 or claimed.lost > 0


def is_suspect(claimed: ops.Claimed) -> bool:
    """A request lost with its worker while it ran alone, or at the end of the bisection of a
    crashed batch (its cap is 1), or whose run failed (retried: a generate worker fails every
    running sequence when its engine process dies): it runs alone, so that it cannot take
    others down with it."""
    return claimed.cap == 1 or claimed.attempt >= 2


def batch_cap(claimed: ops.Claimed) -> int:
    """The largest batch ``claimed`` may run in: 1 for a suspect, else half the batch it was
    lost in (bisection); 0: no limit."""
    return 1 if is_suspect(claimed) else claimed.cap


def decode_claims(config: WorkerConfig, claimed: Sequence[ops.Claimed], now_ms: int,
                  clock: Callable[[], float]) -> tuple[list[Claim], list[ops.Completion]]:
    """Decode and check claimed payloads: the valid ones (times put on ``clock``), and a
    failed completion for each malformed one or one that belongs to another request or queue
    (each fails alone: whatever a payload makes the decoder raise, never its neighbours or the
    worker)."""
    valid: list[tuple[ops.Claimed, RequestPayload]] = []
    failures: list[ops.Completion] = []
    payloads = [c.payload for c in claimed]
    decoded: list[RequestPayload | Exception]
    try:
        decoded = list(decode_requests(payloads, config.limits))
    except Exception:  # the window path met what it did not expect: one payload at a time
        decoded = [_decode_alone(data, config) for data in payloads]
    for c, payload in zip(claimed, decoded, strict=True):
        try:
            if isinstance(payload, Exception):
                raise payload
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


def _decode_alone(data: bytes, config: WorkerConfig) -> RequestPayload | Exception:
    try:
        return decode_request(data, config.limits)
    except Exception as exc:  # returned, to fail this payload alone
        return exc


def completion(config: WorkerConfig, claim: Claim, outcome: Any, **fields: Any) -> ops.Completion:
    """The completion of a request that ran: ``outcome`` is its output, or its ``Failure``
    (sent back for a retry while attempts remain; else dead if retryable, failed if not).
    ``fields`` are the result's other fields (timings, sizes). An output too large to store,
    or one msgpack cannot carry, becomes a failed result."""
    c = claim.claimed
    if isinstance(outcome, Failure):
        if outcome.retryable and c.attempt < claim.payload.max_attempts:
            return ops.Completion(c, "retry", b"", config.retry_delay_ms(c.attempt))
        status = Status.DEAD if outcome.retryable else Status.FAILED
        body: dict[str, Any] = {"error": outcome.error}
    else:
        status, body = Status.OK, {"output": outcome}
    common: dict[str, Any] = dict(
        id=c.id, task=config.task, model=config.model_name, worker=config.worker_id,
        attempts=c.attempt, enqueued_ms=c.enqueued_ms, started_ms=claim.claimed_ms,
        trace_id=trace_id_of(claim.payload.traceparent), lost_runs=c.lost or None,
        **fields)
    met = None if claim.payload.ttft_slo_ms is None else slo.met(
        claim.payload.ttft_slo_ms, c.enqueued_ms, fields.get("finished_ms"),
        fields.get("ttft_ms"), status is Status.OK)
    if met is not None:
        common["slo_met"] = met
    ratio = None if status is not Status.OK else slo.prediction_ratio(
        c.predicted_ms, c.enqueued_ms, fields.get("finished_ms"), fields.get("ttft_ms"))
    try:
        data = encode_result_fields({"status": status, **body, **common}, config.limits)
    except (InferqError, TypeError, ValueError, OverflowError):
        status, data = _encode_checked(config, status, body, common)
    prompt, generated = billable(fields)
    return ops.Completion(c, status.value, data, prompt_tokens=prompt,
                          completion_tokens=generated, slo_met=met, predicted_ratio=ratio)


def billable(fields: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of a result's fields: its ``usage``, else its
    ``input_tokens`` as prompt tokens (embeddings), else none."""
    usage = fields.get("usage")
    if isinstance(usage, Usage):
        return usage.prompt_tokens, usage.completion_tokens
    tokens = fields.get("input_tokens")
    return (tokens, 0) if isinstance(tokens, int) and tokens > 0 else (0, 0)


def _encode_checked(config: WorkerConfig, status: Status, body: dict[str, Any],
                    common: dict[str, Any]) -> tuple[Status, bytes]:
    """The result through the model (``Result``, then ``encode_result``): what pydantic
    converts is converted, and an output that cannot be stored becomes a failed result."""
    try:
        return status, encode_result(Result(status=status, **body, **common), config.limits)
    except InferqError as exc:
        error = ErrorInfo(code=exc.code, message=exc.message)
        return Status.FAILED, encode_result(Result(status=Status.FAILED, error=error, **common),
                                            config.limits)


def batch_completions(config: WorkerConfig, claims: Sequence[Claim], outcomes: Sequence[Any],
                      input_tokens: Sequence[int], *, finished_ms: int,
                      compute_ms: float,
                      truncated: Sequence[bool] | None = None) -> list[ops.Completion]:
    """``completion`` for each request of a batch that ran together, in one pass: the fields
    they share are made once, every result map is packed by one packer, and no ``Result`` model
    is built for a plain output (a failure, a None output, or an output msgpack cannot carry
    as it is goes through ``completion``)."""
    packer = msgpack.Packer(use_bin_type=True)
    limit = config.limits.max_result_bytes
    task, model, worker = config.task, config.model_name, config.worker_id
    size = len(claims)
    out: list[ops.Completion] = []
    cuts = truncated if truncated is not None else [False] * size
    for claim, outcome, tokens, cut in zip(claims, outcomes, input_tokens, cuts, strict=True):
        c = claim.claimed
        if outcome is not None and not isinstance(outcome, Failure):
            # Result's field order (RESULT_FIELDS), None fields left out: encode_result's bytes.
            body = {"v": WIRE_VERSION, "id": c.id, "status": "ok", "output": outcome,
                    "task": task, "model": model, "worker": worker, "attempts": c.attempt,
                    "batch_size": size, "input_tokens": tokens}
            if cut:
                body["truncated"] = True
            body.update(enqueued_ms=c.enqueued_ms, started_ms=claim.claimed_ms,
                        finished_ms=finished_ms, compute_ms=compute_ms)
            if (traceparent := claim.payload.traceparent) is not None:
                body["trace_id"] = traceparent[3:35]
            met = None
            if (objective := claim.payload.ttft_slo_ms) is not None:
                met = body["slo_met"] = finished_ms - c.enqueued_ms <= objective
            if c.lost:
                body["lost_runs"] = c.lost
            try:
                data = packer.pack(body)
            except (TypeError, ValueError, OverflowError):
                packer = msgpack.Packer(use_bin_type=True)
            else:
                if len(data) <= limit:
                    out.append(ops.Completion(
                        c, "ok", data, prompt_tokens=tokens, slo_met=met,
                        predicted_ratio=slo.prediction_ratio(c.predicted_ms, c.enqueued_ms,
                                                             finished_ms)))
                    continue
        out.append(completion(config, claim, outcome, batch_size=size, input_tokens=tokens,
                              truncated=cut or None, finished_ms=finished_ms,
                              compute_ms=compute_ms))
    return out


def failed_completion(config: WorkerConfig, claimed: ops.Claimed, error: InferqError,
                      now_ms: int, status: Status = Status.FAILED,
                      missed: bool = False) -> ops.Completion:
    """A request answered without reaching the model: malformed payload, invalid input, or a
    deadline that passed while it waited in the worker (``expired``). ``missed``: it had a
    latency objective (``slo_met`` False)."""
    data = encode_result_fields({
        "id": claimed.id, "status": status,
        "error": ErrorInfo(code=error.code, message=error.message[:2000]),
        "task": config.task, "model": config.model_name, "worker": config.worker_id,
        "attempts": claimed.attempt, "enqueued_ms": claimed.enqueued_ms, "started_ms": now_ms,
        "finished_ms": now_ms, "slo_met": False if missed else None,
    }, config.limits)
    return ops.Completion(claimed, status.value, data, slo_met=False if missed else None)


def expired(config: WorkerConfig, claims: Sequence[Claim], now_ms: int) -> list[ops.Completion]:
    """``expired`` answers for claims whose deadline passed before they could run."""
    error = DeadlineExceeded("the deadline passed before the request could run")
    return [failed_completion(config, claim.claimed, error, now_ms, Status.EXPIRED,
                              missed=claim.payload.ttft_slo_ms is not None)
            for claim in claims]

