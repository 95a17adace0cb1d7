"""``inferq stats``: queue depths, in flight, live workers, windows, throughput."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import redis

from inferq.affinity_stats import worker_figures
from inferq.cli import statsview
from inferq.cli.options import Subcommands, add_connection_options, connection_from_args
from inferq.connection import sync_client
from inferq.errors import ValidationError
from inferq.protocol import slo
from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys
from inferq.stats import QueueStats, read_all


def add_parser(sub: Subcommands) -> None:
    s = sub.add_parser("stats", help="queue depths, in flight, workers, windows, throughput",
                       description="Every queue a worker has served or a producer has "
                                   "enqueued to: pending by priority, in flight, dead-lettered, "
                                   "live workers, throughput, and each worker's batching.")
    add_connection_options(s)
    s.add_argument("--queue", action="append", metavar="TASK:MODEL",
                   help="only this queue (repeatable; default: every known queue)")
    s.add_argument("--json", action="store_true",
                   help="machine-readable output (numbers as JSON numbers)")
    s.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    s.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes (--watch)")
    s.set_defaults(run=run)


def format_stats(all_stats: list[QueueStats]) -> str:
    if not all_stats:
        return ("no queues yet (a queue appears once a worker serves it or a producer "
                "enqueues to it)")
    lines = []
    for st in all_stats:
        lines.append(f"queue {st.queue}")
        by_prio = ", ".join(f"p{p}={n}" for p, n in sorted(st.pending_by_priority.items(),
                                                           reverse=True)) or "-"
        cap = st.counters.get("dead_cap")
        dead = (f"{st.dead_lettered}" if cap is None else
                f"{st.dead_lettered} (cap {cap}, {st.counters.get('dead_dropped', 0)} fell off)")
        lines.append(f"  pending {st.pending} ({by_prio})  in flight {st.inflight}  "
                     f"dead-lettered {dead}")
        lines.append(f"  live workers {len(st.live_workers)}  "
                     f"throughput {st.throughput_per_s:.1f}/s (last 10 s)")
        if not st.live_workers and st.pending:
            lines.append(f"  NO LIVE WORKER: {st.pending} request(s) wait for one "
                         f"(inferq worker --task {st.queue.partition(':')[0]} "
                         f"--model {st.queue.partition(':')[2]})")
        met, finished = st.slo
        if finished:
            lines.append(f"  latency objectives met {met}/{finished} "
                         f"({met / finished:.1%}, live workers' requests)")
        ratio = st.slo_ratio
        if sum(ratio):
            lines.append(f"  admission's prediction: actual / predicted time p50 "
                         f"{slo.ratio_quantile(ratio, 0.5):.2f}, p90 "
                         f"{slo.ratio_quantile(ratio, 0.9):.2f} ({sum(ratio)} admitted)")
        if st.tenants:
            owned = ", ".join(f"{t}={n}" for t, n in sorted(st.tenants.items()))
            lines.append(f"  tenants (queued or running) {owned}")
        if st.counters:
            totals = "  ".join(f"{k}={v}" for k, v in sorted(st.counters.items()))
            lines.append(f"  totals (since the queue was created) {totals}")
        for worker, w in sorted(st.windows.items()):
            lines.append(format_window(worker, w))
    return "\n".join(lines)


def format_window(worker: str, w: dict[str, Any]) -> str:
    if w.get("mode") == "continuous":
        return format_generation(worker, w)
    return (
        f"  worker {worker}: window now {float(w.get('window_ms', 0)):.1f} ms "
        f"(gathers ~{w.get('target_batch_size', '?')} at the current arrival rate), "
        f"mean batch {float(w.get('mean_batch_size', 0)):.1f} "
        f"(max {w.get('max_batch_size', 0)}), batches {w.get('batches', 0)}, "
        f"padding efficiency {float(w.get('padding_efficiency', 1)):.2f}, "
        f"released by {w.get('reasons', {})}"
    )


def format_generation(worker: str, w: dict[str, Any]) -> str:
    """A ``generate`` worker: its running batch and decode steps (it has no window)."""
    slots = w.get("max_slots", "?")
    return (
        f"  worker {worker}: continuous batching, running {w.get('running', '?')} of {slots} "
        f"slots, {w.get('waiting', '?')} claimed and waiting; steps {w.get('steps', 0)} "
        f"({w.get('admission_steps', '?')} admitting), mean batch "
        f"{float(w.get('mean_batch_size', 0)):.1f} (max {w.get('max_batch_size', 0)}), "
        f"tokens {w.get('tokens', 0)} generated + {w.get('prefill_tokens', 0)} prefilled, "
        f"preemptions {w.get('preemptions', 0)}, finished by {w.get('reasons', {})}"
        + format_affinity(w)
    )


def format_affinity(w: dict[str, Any]) -> str:
    """The prefix cache's hit rate (tokens reused ÷ prompt tokens) and tokens saved, and the
    share of claims taken by cache affinity; '' from a worker that reports neither."""
    figures = worker_figures(w)
    if figures is None:
        return ""
    rate = f"{figures.hit_rate:.0%}" if figures.hit_rate is not None else "-"
    return (f", prefix cache hit rate {rate} ({figures.reused_tokens} prompt tokens saved, "
            f"{figures.held_prefixes} prefixes published), affinity claims "
            f"{figures.affinity_claimed}/{figures.claimed}")


def batch_section(client: redis.Redis) -> str:
    """Batch jobs (``inferq batch``): by status, lines by outcome, active batches' progress."""
    from inferq.batch.batches import format_summary, read_sync

    return format_summary(read_sync(client, DEFAULT_NAMESPACE))


def run(args: argparse.Namespace) -> int:
    client = sync_client(connection_from_args(args))
    queues = [QueueKeys(q).queue for q in args.queue] if args.queue else None
    try:
        if not args.watch:
            all_stats = read_all(client, queues)
            if args.json:
                print(json.dumps([s.as_dict() for s in all_stats], indent=2))
            else:
                print(format_stats(all_stats))
                if batches := batch_section(client):
                    print(batches)
            return 0
        return watch(client, queues, args.interval, as_json=args.json)
    finally:
        client.close()


def watch(client: redis.Redis, queues: list[str] | None, interval: float, *,
          as_json: bool, rounds: int | None = None) -> int:
    """Refresh until interrupted (or ``rounds`` times): a live table on a terminal, one JSON
    document per refresh otherwise."""
    if not interval > 0:
        raise ValidationError(f"--interval must be > 0, got {interval}")
    tty = sys.stdout.isatty() and not as_json
    if tty and statsview.available():
        return watch_rich(client, queues, interval, rounds=rounds)
    done = 0
    try:
        while rounds is None or done < rounds:
            all_stats = read_all(client, queues)
            stamp = time.strftime("%H:%M:%S")
            if as_json:
                print(json.dumps({"time": stamp, "queues": [s.as_dict() for s in all_stats]}),
                      flush=True)
            else:
                if tty:
                    print("\x1b[2J\x1b[H", end="")  # clear the screen, cursor home
                batches = batch_section(client)
                print(f"inferq stats  {stamp}  (every {interval:g} s, Ctrl-C to stop)\n"
                      f"{format_stats(all_stats)}\n{batches + chr(10) if batches else ''}",
                      flush=True)
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return 0


def watch_rich(client: redis.Redis, queues: list[str] | None, interval: float, *,
               rounds: int | None = None, console: Any = None) -> int:
    """``watch`` on a terminal with ``rich`` installed (``inferq[cli]``): a live table."""
    from rich.live import Live

    done = 0
    try:
        with Live(statsview.view(read_all(client, queues), interval), console=console,
                  auto_refresh=False, screen=False) as live:
            while True:
                done += 1
                if rounds is not None and done >= rounds:
                    break
                time.sleep(interval)
                live.update(statsview.view(read_all(client, queues), interval), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0
