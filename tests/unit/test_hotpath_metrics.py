"""Batched metric updates of the worker's hot path count exactly what one update per request
counts."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from inferq.protocol import ops
from inferq.protocol.codec import RequestPayload
from inferq.worker.core.metrics import LATENCY_BUCKETS, WorkerMetrics, observe_many
from inferq.worker.core.results import Claim
from inferq.worker.core.stats import WorkerStats


def completion(request_id: str, token: str, status: str, body: bytes) -> ops.Completion:
    return ops.Completion(ops.Claimed(request_id, b"", token, 1, 0, None), status, body)



def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in registry.collect() for s in metric.samples
            if not s.name.endswith("_created")}


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.floats(0, 200, allow_nan=False),
                                 st.sampled_from(LATENCY_BUCKETS)), max_size=50))
def test_observe_many_counts_what_observe_counts(values: list[float]) -> None:
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("h", "h", ["q"], buckets=LATENCY_BUCKETS, registry=one).labels("x")
    h2 = Histogram("h", "h", ["q"], buckets=LATENCY_BUCKETS, registry=many).labels("x")
    for value in values:
        h1.observe(value)
    observe_many(h2, values)
    a, b = _samples(one), _samples(many)
    assert a.keys() == b.keys()
    for key, value in a.items():
        if key[0] == "h_sum":
            assert math.isclose(value, b[key], rel_tol=1e-12, abs_tol=1e-12)
        else:
            assert value == b[key], key


def _claim(i: int, priority: int, enqueued_ms: int, claimed_ms: int,
           traced: bool = False) -> Claim:
    claimed = ops.Claimed(f"r{i}", b"", "t", 1, enqueued_ms, None)
    payload = RequestPayload(id=f"r{i}", task="embed", model="m", prompt="", priority=priority,
                             traceparent=f"00-{i + 1:032x}-{i + 1:016x}-01" if traced else None)
    return Claim(claimed, payload, 0.0, None, claimed_ms)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 90_000),
                               st.integers(0, 5_000), st.booleans()), max_size=30),
       finished=st.integers(0, 200_000))
def test_observe_latencies_matches_observe_latency(rows: list[tuple[int, int, int, bool]],
                                                   finished: int) -> None:
    claims = [_claim(i, p, e, e + c, traced) for i, (p, e, c, traced) in enumerate(rows)]
    one, many = WorkerMetrics("embed:m", "w"), WorkerMetrics("embed:m", "w")
    for claim in claims:
        one.observe_latency(claim, finished)
    many.observe_latencies(claims, finished)
    a, b = _samples(one.registry), _samples(many.registry)
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert math.isclose(value, b[key], rel_tol=1e-9, abs_tol=1e-9), key


def test_latencies_carry_the_trace_as_exemplar_in_openmetrics_only() -> None:
    metrics = WorkerMetrics("embed:m", "w")
    metrics.observe_latencies([_claim(0, 0, 1000, 1200), _claim(1, 0, 1000, 1300, traced=True),
                               _claim(2, 1, 1000, 1250, traced=True)], 1500)
    ctype, body = metrics.render("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert ctype.startswith("application/openmetrics-text")
    exemplars = [line for line in text.splitlines() if "trace_id" in line]
    # per priority, one traced request on each latency histogram: queue wait, claim to result
    assert {line.split("{", 1)[0] for line in exemplars} == {
        "inferq_queue_wait_seconds_bucket", "inferq_claim_to_result_seconds_bucket"}
    assert {line.rsplit('trace_id="', 1)[1][:32] for line in exemplars} == {
        f"{2:032x}", f"{3:032x}"}
    plain = metrics.render("")[1].decode()
    assert "trace_id" not in plain and "inferq_queue_wait_seconds_bucket" in plain


@given(outcomes=st.lists(st.tuples(st.sampled_from(["ok", "failed", "dead", "expired",
                                                     "retry"]), st.booleans()), max_size=30))
def test_stats_count_tallies_per_status(outcomes: list[tuple[str, bool]]) -> None:
    metrics, stats = WorkerMetrics("embed:m", "w"), WorkerStats()
    completions = [completion(f"r{i}", "t", status, b"") for i, (status, _) in
                   enumerate(outcomes)]
    stats.count(metrics, completions, [ok for _, ok in outcomes])
    expected = WorkerMetrics("embed:m", "w")
    for status, ok in outcomes:
        expected.observe_outcome(status, ok)
    assert _samples(metrics.registry) == _samples(expected.registry)
    assert stats.completed == sum(1 for s, ok in outcomes if ok and s == "ok")
    assert stats.refused == sum(1 for _, ok in outcomes if not ok)


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.floats(-5, 50, allow_nan=False), max_size=40),
       start=st.sampled_from(["fresh", "restored", "running"]),
       tau=st.floats(0.01, 10))
def test_recording_a_window_of_arrivals_equals_recording_each(times: list[float], start: str,
                                                              tau: float) -> None:
    from inferq.worker.window.policy import ArrivalRate

    one, each = ArrivalRate(tau), ArrivalRate(tau)
    for est in (one, each):
        if start == "restored":  # rate kept, clock not: as ``from_state`` leaves it
            est._level, est._weight = 3.0, 0.5
        elif start == "running":
            est.record(-10.0)
            est.record(-9.0)
    for t in times:
        one.record(t)
    each.record_each(times)
    assert (one._last, one._level, one._weight) == (each._last, each._level, each._weight)


def test_window_stats_publish_the_handoff_between_batches() -> None:
    from inferq.worker.window.stats import WindowStats

    stats = WindowStats()
    assert stats.as_fields()["handoffs"] == "0"
    stats.record_handoff(0.002)
    stats.record_handoff(0.004)
    fields = stats.as_fields()
    assert fields["handoffs"] == "2"
    assert float(fields["handoff_s"]) == 0.006
