"""The chaos harness, short: real workers SIGKILLed, one SIGSTOPped past its lease, the Redis
server restarted, poison and expiring requests. Nothing accepted may be lost.

It runs as a user runs it, ``python -m benchmarks chaos --short``, with its JSON report written
to the test's own folder (the recorded ``benchmarks/out`` and RESULTS.md stay untouched)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "chaos", "--short", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    written = tmp_path / "chaos.json"
    assert written.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(written.read_text())["report"]
    short = report["config"]
    assert report["submitted"] == short["requests"]
    assert report["lost"] == 0, report
    assert report["duplicate_results"] == 0
    assert report["still_pending"] == 0
    assert report["unexpected_failures"] == 0, report
    assert (report["kills"], report["stops"], report["redis_restarts"]) == (
        short["kills"], short["stops"], short["restarts"])
    assert report["innocent_dead_letters"] == 0  # every dead letter had really run
    answered = (report["completed"] + report["failed"] + report["dead_lettered"]
                + report["expired"])
    assert answered == short["requests"]
    assert report["dead_lettered"] > 0 and report["expired"] > 0  # poison and expiry did happen
    assert report["executed_more_than_once"] > 0  # kills interrupted work that then re-ran
