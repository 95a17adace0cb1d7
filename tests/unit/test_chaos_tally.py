"""The chaos harness's count of results the producer did not receive: a result written after
the producer's wait had ended is late (the queue was slower than the producer's patience), and
only one written while it still waited is a delivery failure."""

from __future__ import annotations

from dataclasses import asdict

from inferq.protocol.codec import Result, Status
from tests.support.chaos import SHORT, Report, _undelivered


def _result(finished_ms: int) -> Result:
    return Result(id="c7", status=Status.EXPIRED, enqueued_ms=1_000, finished_ms=finished_ms)


def test_a_result_written_after_the_wait_ended_is_late_not_undelivered() -> None:
    report = Report(config=asdict(SHORT))
    _undelivered(report, _result(finished_ms=131_000), "expiring", gave_up_ms=121_000)
    assert (report.answered_after_the_wait, report.answered_but_not_delivered) == (1, 0)
    assert report.answered_after_the_wait_by_kind == {"expiring": 1}
    assert report.undelivered == [{"id": "c7", "kind": "expiring", "status": "expired",
                                   "late": True, "wait_ended_ms": 120_000,
                                   "written_ms": 130_000, "attempts": 0}]


def test_a_result_written_while_the_producer_waited_is_a_delivery_failure() -> None:
    report = Report(config=asdict(SHORT))
    _undelivered(report, _result(finished_ms=60_000), "normal", gave_up_ms=121_000)
    # a result with no recorded end of the wait counts as a failure too (never hidden)
    _undelivered(report, _result(finished_ms=60_000), "normal", gave_up_ms=None)
    assert (report.answered_after_the_wait, report.answered_but_not_delivered) == (0, 2)
    assert report.answered_after_the_wait_by_kind == {}
    assert [u["late"] for u in report.undelivered] == [False, False]
