"""Latency objectives without a server: whether a result met its objective, the worker's
results (fast path and model path agree), the deadline score layout and the policy argument."""

from __future__ import annotations

import msgpack
import pytest

from inferq.connection import ConnectionSettings
from inferq.errors import InvalidInput
from inferq.protocol import ops, scores, slo
from inferq.protocol.codec import RequestPayload, decode_result, encode_request
from inferq.protocol.settings import QueueSettings
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.results import (
    Claim,
    batch_completions,
    completion,
    expired,
    failed_completion,
)

CONFIG = WorkerConfig(connection=ConnectionSettings("redis://127.0.0.1:1/0"), model_name="m",
                      model_spec="builtin:echo", worker_id="w1")


def claim(request_id: str, slo_ms: int | None, enqueued_ms: int = 1000,
          predicted_ms: int = 0) -> Claim:
    payload = RequestPayload(id=request_id, task="embed", model="m", prompt="p",
                             ttft_slo_ms=slo_ms)
    claimed = ops.Claimed(request_id, encode_request(payload), "t", 1, enqueued_ms, None,
                          predicted_ms=predicted_ms)
    return Claim(claimed, payload, 0.0, None, enqueued_ms + 5)


def test_met_by_the_result_or_by_the_first_token() -> None:
    assert slo.met(None, 0, 10) is None
    assert slo.met(100, 1000, 1100) is True
    assert slo.met(100, 1000, 1101) is False
    assert slo.met(100, 1000, 5000, ttft_ms=99.5) is True  # generate: the first token counts
    assert slo.met(100, 1000, 1001, ok=False) is False
    assert slo.met(100, None, 1001) is None


def test_the_worker_writes_slo_met_on_both_result_paths() -> None:
    claims = [claim("a", 50), claim("b", 10), claim("c", None)]
    fast = batch_completions(CONFIG, claims, [[1.0], [2.0], [3.0]], [1, 1, 1],
                             finished_ms=1040, compute_ms=1.0)
    met = [decode_result(c.body).slo_met for c in fast]
    assert met == [True, False, None]
    # the model path gives the same bytes as the fast path
    for c, done in zip(claims, fast, strict=True):
        model = completion(CONFIG, c, [float(1 + claims.index(c))], batch_size=3,
                           input_tokens=1, finished_ms=1040, compute_ms=1.0)
        assert model.body == done.body
    # a request that expired in the worker missed its objective
    (gone,) = expired(CONFIG, [claim("d", 50)], 2000)
    assert decode_result(gone.body).slo_met is False
    (plain,) = expired(CONFIG, [claim("e", None)], 2000)
    assert "slo_met" not in msgpack.unpackb(plain.body)


def test_the_deadline_layout_keeps_priority_and_stays_below_2_53() -> None:
    top = scores.band(scores.PRIORITY_MIN) + scores.SEQ_LIMIT - 1
    assert top < 2 ** 53
    # the largest tag of each half stays in its half, and in the band
    assert scores.deadline_tag(10 ** 30, 2 ** 20) < scores.DEADLINE_SPLIT
    fair_max = (scores.DEADLINE_SPLIT + (scores.DEADLINE_VT_LIMIT - 1) * scores.TIE_LIMIT
                + scores.TIE_LIMIT - 1)
    assert fair_max < scores.SEQ_LIMIT
    assert scores.deadline_tag(-5, 0) == 0
    assert scores.deadline_tag(3, 1) < scores.deadline_tag(4, 0)
    # a one-day objective is far inside the offsets
    assert scores.MAX_SLO_MS * 700 < scores.DEADLINE_OFFSET_LIMIT


@pytest.mark.parametrize(("order", "rate", "expected"), [
    ("fair", None, "fair"), ("deadline", None, "deadline"), ("deadline", 12.5, "deadline 12.5"),
    ("fair", 0.0, "fair"), ("deadline", float("inf"), "deadline")])
def test_policy(order: str, rate: float | None, expected: str) -> None:
    assert slo.policy(order, rate) == expected


def test_policy_with_a_bound_on_queued_tokens() -> None:
    assert slo.policy("fair", None, 4096) == "fair q4096"
    assert slo.policy("deadline", 12.5, 10) == "deadline 12.5 q10"
    assert slo.max_queued_tokens("deadline 12.5 q10") == 10
    assert slo.max_queued_tokens("fair 3") == 0
    settings = QueueSettings(shards=3, max_queued_tokens=100)
    assert slo.queue_policy(settings) == "fair q34"


def test_late_outcomes_and_the_fleet_rate() -> None:
    assert slo.late_ms("late:1234") == 1234
    assert slo.late_ms("queued") is None
    windows = [{"latency_a_ms": "10", "latency_b_ms": "20", "batch_limit": "8", "batches": "3"},
               {"latency_a_ms": "10", "latency_b_ms": "20", "batch_limit": "8", "batches": "0"},
               {"latency_a_ms": "x"}]
    assert slo.fleet_rate(windows) == pytest.approx(8 / 0.1)
    assert slo.fleet_rate([]) is None


def test_goodput_is_counted_published_and_shown() -> None:
    from inferq.cli.stats import format_stats
    from inferq.stats import QueueStats
    from inferq.worker.core.metrics import WorkerMetrics
    from inferq.worker.core.stats import WorkerStats

    claims = [claim("a", 50), claim("b", 10), claim("c", None), claim("d", 50)]
    done = batch_completions(CONFIG, claims, [[1.0]] * 4, [1] * 4, finished_ms=1040,
                             compute_ms=1.0)
    metrics, stats = WorkerMetrics("embed:m", "w1"), WorkerStats()
    stats.count(metrics, done, [True, True, True, False])  # d's write was refused
    registry = metrics.registry
    assert registry.get_sample_value("inferq_slo_met_total",
                                     {"queue": "embed:m", "met": "true"}) == 1
    assert registry.get_sample_value("inferq_slo_met_total",
                                     {"queue": "embed:m", "met": "false"}) == 1
    fields = stats.fields()
    assert (fields["slo_met"], fields["slo_missed"]) == ("1", "1")
    queue = QueueStats("embed:m", {}, 0, 0, ["w1", "w2"], {}, 0.0,
                       windows={"w1": {"slo_met": 3, "slo_missed": 1}, "w2": {"slo_met": 4}})
    assert queue.slo == (7, 8)
    assert queue.as_dict()["slo"] == {"met": 7, "finished": 8, "fraction": 7 / 8,
                                      "predicted": 0, "ratio_p50": None, "ratio_p90": None}
    assert "latency objectives met 7/8 (87.5%" in format_stats([queue])


def test_the_prediction_s_error_is_measured_counted_and_shown() -> None:
    from inferq.cli.stats import format_stats
    from inferq.stats import QueueStats
    from inferq.worker.core.metrics import WorkerMetrics
    from inferq.worker.core.stats import WorkerStats

    # enqueued at 1000, finished at 1040: 40 ms against predictions of 20, 40 and 80 ms
    claims = [claim("a", 50, predicted_ms=20), claim("b", 50, predicted_ms=40),
              claim("c", 50, predicted_ms=80), claim("d", 50)]
    done = batch_completions(CONFIG, claims, [[1.0]] * 4, [1] * 4, finished_ms=1040,
                             compute_ms=1.0)
    assert [c.predicted_ratio for c in done] == [2.0, 1.0, 0.5, None]
    # the model path (generate: the first token counts) and a failure
    first = completion(CONFIG, claim("e", 50, predicted_ms=40), [1.0], ttft_ms=60.0,
                       finished_ms=5000)
    assert first.predicted_ratio == 1.5
    assert failed_completion(CONFIG, claims[0].claimed, InvalidInput("x"),
                             1040).predicted_ratio is None
    metrics, stats = WorkerMetrics("embed:m", "w1"), WorkerStats()
    stats.count(metrics, [*done, first], [True] * 5)
    assert metrics.registry.get_sample_value("inferq_slo_prediction_ratio_count",
                                             {"queue": "embed:m"}) == 4
    assert metrics.registry.get_sample_value("inferq_slo_prediction_ratio_bucket",
                                             {"queue": "embed:m", "le": "1.0"}) == 2
    published = stats.fields()["slo_ratio"]
    assert slo.ratio_counts(published) == [0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]
    queue = QueueStats("embed:m", {}, 0, 0, ["w1", "w2"], {}, 0.0,
                       windows={"w1": {"slo_ratio": published}, "w2": {"slo_ratio": "bad"}})
    shown = queue.as_dict()["slo"]
    assert shown["predicted"] == 4
    # 4 ratios: the 2nd (p50) ends the (0.9, 1.0] bucket; the 90th percentile lies in (1.5, 2]
    assert shown["ratio_p50"] == pytest.approx(1.0)
    assert shown["ratio_p90"] == pytest.approx(1.5 + 0.5 * 0.6)
    assert "actual / predicted time p50 1.00, p90 1.80 (4 admitted)" in format_stats([queue])


def test_ratio_quantiles() -> None:
    assert slo.ratio_quantile([0] * 13, 0.5) is None
    assert slo.ratio_bucket(0.1) == 0 and slo.ratio_bucket(10.0) == 11
    assert slo.ratio_bucket(11.0) == 12
    above = [0] * 12 + [3]
    assert slo.ratio_quantile(above, 0.5) == slo.RATIO_BUCKETS[-1]
    even = [0, 2, 2] + [0] * 10  # two in (0.25, 0.5], two in (0.5, 0.75]
    assert slo.ratio_quantile(even, 0.5) == pytest.approx(0.5)
    assert slo.ratio_quantile(even, 0.75) == pytest.approx(0.625)


def test_a_generate_worker_publishes_its_decode_fit_and_prefill_rate() -> None:
    from typing import Any, cast

    from inferq.worker.generate.stats import GenerationStats
    from inferq.worker.generate.steploop import StepOutput

    stats = GenerationStats()
    assert stats.capacity_fields() == {}
    rows: Any = [(None, 1, "")]
    for n, seconds in ((2, 0.030), (4, 0.050), (2, 0.030), (4, 0.050)):  # 10 ms a row + 10
        stats.record(StepOutput(cast(Any, rows * n), [], 0, 0, seconds))
    stats.record(StepOutput(cast(Any, rows * 4), [], 2, 300, 0.150))  # 100 ms beyond decode
    fields = stats.capacity_fields()
    assert float(fields["decode_a_ms"]) == pytest.approx(10)
    assert float(fields["decode_b_ms"]) == pytest.approx(10)
    assert float(fields["prefill_tokens_per_s"]) == pytest.approx(3000)
    published = {**fields, "mode": "continuous", "max_slots": "4"}
    service = slo.fleet_tokens([published, published, {"mode": "window"}, {"mode": "continuous"}])
    assert service is not None
    assert service.decode_per_s == pytest.approx(2 * 4 / 0.05) and service.slots == 8
    assert service.prefill_per_s == pytest.approx(6000)
    assert slo.fleet_tokens([{"mode": "continuous", "max_slots": "4"}]) is None
    assert slo.policy("fair", None, None, service) == "fair t160:8"
    sharded = slo.queue_policy(QueueSettings(shards=2, token_service=service))
    assert sharded == "fair t80:4"
