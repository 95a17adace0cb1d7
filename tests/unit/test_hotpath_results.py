"""The worker's fast result path writes exactly what the model path (``Result`` then
``encode_result``) writes: the same bytes for plain outputs, the same failed result for an
output that cannot be stored, and the same retry / dead decisions for failures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.connection import ConnectionSettings
from inferq.errors import InferqError
from inferq.protocol import ops
from inferq.protocol.codec import (
    ErrorInfo,
    Limits,
    RequestPayload,
    Result,
    Status,
    Usage,
    encode_result,
    encode_result_fields,
)
from inferq.protocol.generation import FinishReason
from inferq.tracing import trace_id_of
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.failures import Failure
from inferq.worker.core.results import Claim, batch_completions, completion

LIMITS = Limits(max_result_bytes=600)
CONFIG = WorkerConfig(connection=ConnectionSettings("redis://127.0.0.1:1/0"), model_name="m",
                      model_spec="builtin:echo", worker_id="w1", limits=LIMITS)


def reference(config: WorkerConfig, claim: Claim, outcome: Any, **fields: Any) -> ops.Completion:
    """``completion`` as it was before the fast path: every result through ``Result``."""
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
        trace_id=trace_id_of(claim.payload.traceparent), **fields)
    try:
        data = encode_result(Result(status=status, **body, **common), config.limits)
    except InferqError as exc:
        status = Status.FAILED
        data = encode_result(Result(status=status, error=ErrorInfo(code=exc.code,
                                                                   message=exc.message),
                                    **common), config.limits)
    return ops.Completion(c, status.value, data)


def claim_of(i: int, attempt: int = 1, max_attempts: int = 3,
             traced: bool | None = None) -> Claim:
    """Request ``r<i>``; an odd one carries a trace context (unless ``traced`` says)."""
    rid = f"r{i}"
    claimed = ops.Claimed(id=rid, payload=b"", token=f"t{i}", attempt=attempt,
                          enqueued_ms=1_700_000_000_000 + i, deadline_ms=None)
    traceparent = f"00-{i + 1:032x}-{i + 1:016x}-01"
    payload = RequestPayload(id=rid, task="embed", model="m", prompt="p",
                             max_attempts=max_attempts,
                             traceparent=traceparent if (traced if traced is not None
                                                         else i % 2 == 1) else None)
    return Claim(claimed, payload, 0.0, None, 1_700_000_000_500 + i)


@dataclass
class Opaque:
    """An output msgpack cannot carry, but pydantic turns into a map."""

    x: int


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                    st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20))
plain_outputs = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12)
failures = st.builds(
    Failure, st.builds(ErrorInfo, code=st.sampled_from(["model_error", "invalid_input"]),
                       message=st.text(max_size=30)), st.booleans())
outcomes = st.one_of(
    plain_outputs,
    failures,
    st.integers(2**64, 2**70),  # too large for msgpack
    st.just("x" * 700),  # over max_result_bytes
    st.lists(st.floats(allow_nan=False, width=32), min_size=60, max_size=80),
    st.builds(Opaque, st.integers(0, 9)),
    st.just({1, 2}),  # neither msgpack nor the result model's serializer can store it
)


def _same(fast: ops.Completion, ref: ops.Completion) -> None:
    assert (fast.id, fast.token, fast.status) == (ref.id, ref.token, ref.status)
    assert fast.body == ref.body
    if ref.status == "retry":  # the delay is jittered: both within the backoff's bounds
        assert 1 <= fast.retry_delay_ms <= CONFIG.retry_max_ms


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(st.tuples(outcomes, st.integers(1, 3), st.integers(1, 3),
                                st.integers(0, 4096)), min_size=1, max_size=6),
       compute_ms=st.floats(0, 1e4, allow_nan=False))
def test_batch_completions_write_what_the_model_path_writes(
        batch: list[tuple[Any, int, int, int]], compute_ms: float) -> None:
    claims = [claim_of(i, attempt, max_attempts)
              for i, (_, attempt, max_attempts, _) in enumerate(batch)]
    outs = [outcome for outcome, *_ in batch]
    tokens = [n for *_, n in batch]
    try:
        expected = [reference(CONFIG, claim, out, batch_size=len(batch), input_tokens=n,
                              finished_ms=1_700_000_001_000, compute_ms=compute_ms)
                    for claim, out, n in zip(claims, outs, tokens, strict=True)]
    except Exception as exc:  # the model path itself crashes: the fast path must too
        with pytest.raises(type(exc)):
            batch_completions(CONFIG, claims, outs, tokens, finished_ms=1_700_000_001_000,
                              compute_ms=compute_ms)
        return
    got = batch_completions(CONFIG, claims, outs, tokens, finished_ms=1_700_000_001_000,
                            compute_ms=compute_ms)
    assert len(got) == len(expected)
    for fast, ref in zip(got, expected, strict=True):
        _same(fast, ref)


@settings(max_examples=200, deadline=None)
@given(outcome=outcomes, attempt=st.integers(1, 3), traced=st.booleans(),
       extra=st.fixed_dictionaries({}, optional={
           "batch_size": st.integers(1, 64), "input_tokens": st.integers(0, 999),
           "finished_ms": st.integers(0, 2**41), "compute_ms": st.floats(0, 1e4),
           "finish_reason": st.sampled_from(list(FinishReason)),
           "usage": st.builds(Usage, prompt_tokens=st.integers(0, 99),
                              completion_tokens=st.integers(0, 99)),
           "ttft_ms": st.one_of(st.none(), st.floats(0, 1e4)),
       }))
def test_completion_writes_what_the_model_path_writes(outcome: Any, attempt: int,
                                                      traced: bool,
                                                      extra: dict[str, Any]) -> None:
    claim = claim_of(0, attempt, traced=traced)
    try:
        ref = reference(CONFIG, claim, outcome, **extra)
    except Exception as exc:
        with pytest.raises(type(exc)):
            completion(CONFIG, claim, outcome, **extra)
        return
    _same(completion(CONFIG, claim, outcome, **extra), ref)


def test_fields_encode_to_the_same_bytes_and_back() -> None:
    fields: dict[str, Any] = dict(
        id="r1", status=Status.EXPIRED, error=ErrorInfo(code="deadline_exceeded", message="m"),
        task="embed", model="m", worker="w", attempts=2, enqueued_ms=1, started_ms=2,
        finished_ms=3, finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=3),
        ttft_ms=1.5, unknown_field="dropped", output=None)
    data = encode_result_fields(fields)
    assert data == encode_result(Result(**fields))
    assert Result.model_validate(Result(**fields).model_dump()) == Result(**fields)


def test_an_output_over_the_limit_fails_with_the_size_error() -> None:
    [done] = batch_completions(CONFIG, [claim_of(0)], ["x" * 700], [1], finished_ms=5,
                               compute_ms=1.0)
    assert done.status == "failed"
    result = Result.model_validate(__import__("msgpack").unpackb(done.body))
    assert result.error is not None and result.error.code == "payload_too_large"
    assert not math.isnan(result.finished_ms or 0)
