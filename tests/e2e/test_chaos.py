"""The chaos harness, short: real workers SIGKILLed, one SIGSTOPped past its lease, the Redis
server restarted, poison, crash poison and expiring requests. Nothing accepted may be lost.

The harness is ``tests/support/chaos.py`` (``python -m benchmarks chaos`` runs it at length);
the tally reads the producer's results, the queue's sets and its stats counters."""

from __future__ import annotations

from pathlib import Path

from tests.support.chaos import SHORT, run_chaos


def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    report = run_chaos(SHORT, tmp_path)
    assert report.submitted == SHORT.requests
    assert report.lost == 0, report
    assert report.duplicate_results == 0
    assert report.still_pending == 0
    assert report.answered_but_not_delivered == 0, report.undelivered
    assert report.unexpected_failures == 0, report
    assert (report.kills, report.stops, report.redis_restarts) == (
        SHORT.kills, SHORT.stops, SHORT.restarts)
    assert report.innocent_dead_letters == 0  # every dead letter had really run
    # the crash poison was found (its batches halved, then it crashed workers alone) and
    # dead-lettered crashed_worker; no other request was
    assert report.innocent_crash_dead_letters == 0, report
    assert report.crash_poisons_dead_lettered == SHORT.crash_poisons, report
    assert report.crash_deaths >= 2
    answered = report.completed + report.failed + report.dead_lettered + report.expired
    assert answered == SHORT.requests
    assert report.dead_lettered > 0 and report.expired > 0  # poison and expiry did happen
    assert report.executed_more_than_once > 0  # kills interrupted work that then re-ran
