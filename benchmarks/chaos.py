"""Scenario ``chaos``: real worker processes against a real server with AOF while workers are
killed and paused and the server restarts, with poison and expiring requests; nothing may be
lost. The harness is ``tests/support/chaos.py``, which the test suite runs too (``SHORT``).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.framework import Run, Scenario, render
from benchmarks.harness import positive_float, positive_int
from tests.support.chaos import QUICK, SHORT, ChaosConfig, run_chaos


class Chaos(Scenario[ChaosConfig]):
    name = "chaos"
    title = "crashes, pauses, Redis restarts, poison, expiry"
    quick_help = "3,000 requests, 3 workers, 5 kills (~20 s); not recorded in RESULTS.md"
    config = ChaosConfig
    trials = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--short", action="store_true",
                            help="the test suite's run: 1,200 requests at 240/s, 2 workers, 3 "
                                 "kills, the default lease (~10 s); not recorded in RESULTS.md")
        for flag, what in (("requests", "request count"), ("workers", "worker count")):
            parser.add_argument(f"--{flag}", type=positive_int, help=f"override the {what}")
        for flag, what in (("kills", "number of SIGKILLs"), ("stops", "number of SIGSTOPs"),
                           ("restarts", "number of Redis restarts"),
                           ("crash-poisons", "number of requests that crash their worker")):
            parser.add_argument(f"--{flag}", type=int, help=f"override the {what}")
        parser.add_argument("--rate", type=float, dest="rate_per_s",
                            help="override the enqueue rate (requests/s)")
        parser.add_argument("--lease-ms", type=positive_int,
                            help="the workers' --lease-ms (default: the worker's default)")
        parser.add_argument("--result-timeout", type=positive_float, dest="result_timeout_s",
                            help="how long the producer awaits each result (s; default 120)")

    def configure(self, args: argparse.Namespace) -> ChaosConfig:
        base = SHORT if args.short else QUICK if args.quick else ChaosConfig()
        return replace(base, **{k: v for k in ("requests", "workers", "kills", "stops",
                                                "restarts", "rate_per_s", "lease_ms",
                                                "crash_poisons", "result_timeout_s")
                                if (v := getattr(args, k)) is not None})

    def records(self, args: argparse.Namespace) -> bool:
        return not (args.quick or args.short)

    def measure(self, run: Run[ChaosConfig]) -> dict[str, Any]:
        """The run in a temporary folder; the workers' logs and the model's records of what ran
        when are kept in ``<out>/logs/chaos`` (the server's data is not)."""
        keep = run.log_dir / "chaos"
        shutil.rmtree(keep, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="inferq-chaos-") as tmp:
            try:
                return {"report": run_chaos(run.cfg, Path(tmp)).as_dict()}
            finally:
                shutil.copytree(tmp, keep, ignore=shutil.ignore_patterns("redis"))

    def markdown(self, report: Mapping[str, Any]) -> str:
        r = report["report"]
        def figures(kind: str, what: str = "recovery") -> str:
            rec = [r.get(f"{what}_{kind}{k}_ms") for k in ("p50", "p99", "max")]
            return ("-" if rec[0] is None
                    else " / ".join(f"{x:.0f}" for x in rec) + " ms")

        down = r.get("restart_down_ms") or []
        return render("chaos", r, lease=r["config"]["lease_ms"] or "default",
                      recovery=figures(""), recovery_calm=figures("calm_"),
                      rerun=figures("", "rerun"), rerun_from_redis=figures("from_redis_", "rerun"),
                      rerun_served=figures("served_", "rerun"),
                      rerun_unserved=figures("unserved_", "rerun"),
                      rerun_served_within_1s=r.get("rerun_served_within_1s", "-"),
                      rerun_served_samples=r.get("rerun_served_samples", "-"),
                      registration=_registration(r.get("timeline") or []),
                      kills_with_no_other_worker=r.get("kills_with_no_other_worker", "-"),
                      start_failures=r.get("start_failures", "-"),
                      restart_down=", ".join(f"{x / 1e3:.1f}" for x in down) or "-",
                      late_kinds=", ".join(
                          f"{kind} {n}" for kind, n in sorted(
                              (r.get("answered_after_the_wait_by_kind") or {}).items()))
                      or "none",
                      throughput_text=" / ".join(
                          f"{r['throughput'].get(k, 0):.0f}" for k in ("before", "during",
                                                                       "after")))

    def exit_code(self, report: Mapping[str, Any]) -> int:
        counts = report["report"]
        clean = (counts["lost"], counts["duplicate_results"], counts["innocent_dead_letters"],
                 counts.get("innocent_crash_dead_letters", 0),
                 counts.get("answered_but_not_delivered", 0))
        return 0 if clean == (0, 0, 0, 0, 0) else 1


def _registration(timeline: list[list[Any]]) -> str:
    """Worker start to registration (its first heartbeat): p50 / max, in seconds."""
    started = {worker: ms for ms, kind, worker in timeline if kind == "start"}
    waits = sorted(ms - started[worker] for ms, kind, worker in timeline
                   if kind == "registered" and worker in started)
    if not waits:
        return "-"
    return f"{waits[len(waits) // 2] / 1e3:.1f} / {waits[-1] / 1e3:.1f} s"


SCENARIO = Chaos()
