"""What a worker publishes for the dashboard (``WorkerMetrics.dashboard_fields``): its
queue-wait p50/p99 and its device memory."""

from __future__ import annotations

from inferq.worker.core.metrics import RECENT_WAITS, WorkerMetrics


def test_the_published_waits_are_quantiles_of_the_last_requests() -> None:
    metrics = WorkerMetrics("embed:m", "w")
    assert metrics.dashboard_fields() == {}
    metrics.recent_waits.extend(i / 1000 for i in range(1, 101))  # 1..100 ms
    fields = metrics.dashboard_fields()
    assert (fields["wait_p50_ms"], fields["wait_p99_ms"]) == ("51.0", "100.0")
    metrics.recent_waits.extend([5.0] * RECENT_WAITS)  # only the last RECENT_WAITS count
    assert metrics.dashboard_fields()["wait_p50_ms"] == "5000.0"
    assert RECENT_WAITS == 2048


def test_the_last_device_memory_sample_is_published_in_mib() -> None:
    metrics = WorkerMetrics("embed:m", "w")
    metrics.last_device_memory = (3 * 2**30, 4 * 2**30)
    assert metrics.dashboard_fields() == {"device_memory_mb": "3072",
                                          "device_reserved_mb": "4096"}
