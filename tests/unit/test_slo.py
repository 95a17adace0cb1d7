"""Latency objectives without a server: whether a result met its objective, the worker's
results (fast path and model path agree), the deadline score layout and the policy argument."""

from __future__ import annotations

import msgpack
import pytest

from inferq.connection import ConnectionSettings
from inferq.protocol import ops, scores, slo
from inferq.protocol.codec import RequestPayload, decode_result, encode_request
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.results import Claim, batch_completions, completion, expired

CONFIG = WorkerConfig(connection=ConnectionSettings("redis://127.0.0.1:1/0"), model_name="m",
                      model_spec="builtin:echo", worker_id="w1")


def claim(request_id: str, slo_ms: int | None, enqueued_ms: int = 1000) -> Claim:
    payload = RequestPayload(id=request_id, task="embed", model="m", prompt="p",
                             ttft_slo_ms=slo_ms)
    claimed = ops.Claimed(request_id, encode_request(payload), "t", 1, enqueued_ms, None)
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
    assert queue.as_dict()["slo"] == {"met": 7, "finished": 8, "fraction": 7 / 8}
    assert "latency objectives met 7/8 (87.5%" in format_stats([queue])
