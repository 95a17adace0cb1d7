"""The queue-wait p50/p99 a worker publishes for the dashboard (``WorkerMetrics.wait_fields``)."""

from __future__ import annotations

from inferq.worker.core.metrics import RECENT_WAITS, WorkerMetrics


def test_the_published_waits_are_quantiles_of_the_last_requests() -> None:
    metrics = WorkerMetrics("embed:m", "w")
    assert metrics.wait_fields() == {}
    metrics.recent_waits.extend(i / 1000 for i in range(1, 101))  # 1..100 ms
    fields = metrics.wait_fields()
    assert (fields["wait_p50_ms"], fields["wait_p99_ms"]) == ("51.0", "100.0")
    metrics.recent_waits.extend([5.0] * RECENT_WAITS)  # only the last RECENT_WAITS count
    assert metrics.wait_fields()["wait_p50_ms"] == "5000.0"
    assert RECENT_WAITS == 2048
