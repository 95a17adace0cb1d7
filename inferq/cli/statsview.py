"""``inferq stats --watch`` on a terminal, drawn by ``rich`` (a live, redrawn table).

``rich`` is not a dependency of the producer's light install: it comes with the ``cli`` extra
(``pip install 'inferq[cli]'``). Without it, ``--watch`` falls back to the plain text of
``inferq stats`` redrawn with ANSI escapes (``inferq.cli.stats.watch``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from inferq.stats import QueueStats

if TYPE_CHECKING:
    from rich.console import RenderableType


def available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def view(all_stats: list[QueueStats], interval: float) -> RenderableType:
    """One frame: a table of the queues, then one of their live workers."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    queues = Table(title=f"inferq stats  {time.strftime('%H:%M:%S')}  (every {interval:g} s, "
                         "Ctrl-C to stop)", title_justify="left", expand=True)
    for name, justify in (("queue", "left"), ("pending", "right"), ("by priority", "left"),
                          ("in flight", "right"), ("dead", "right"), ("workers", "right"),
                          ("throughput/s", "right")):
        queues.add_column(name, justify=justify)  # type: ignore[arg-type]
    workers = Table(expand=True)
    for name in ("queue", "worker", "window / slots", "mean batch", "batches", "padding",
                 "released by"):
        workers.add_column(name)
    for st in all_stats:
        by_prio = " ".join(f"p{p}={n}" for p, n in sorted(st.pending_by_priority.items(),
                                                          reverse=True)) or "-"
        alert = "bold red" if st.pending and not st.live_workers else ""
        queues.add_row(st.queue, Text(str(st.pending), style=alert), by_prio,
                       str(st.inflight), str(st.dead_lettered),
                       Text(str(len(st.live_workers)), style=alert),
                       f"{st.throughput_per_s:.1f}")
        for worker, w in sorted(st.windows.items()):
            workers.add_row(st.queue, worker, _slots(w),
                            f"{float(w.get('mean_batch_size', 0)):.1f}",
                            str(w.get("batches", w.get("steps", 0))),
                            f"{float(w.get('padding_efficiency', 1)):.2f}",
                            str(w.get("reasons", {})))
    if not all_stats:
        return Text("no queues yet (a queue appears once a worker serves it or a producer "
                    "enqueues to it)")
    return Group(queues, workers)


def _slots(w: dict[str, Any]) -> str:
    if w.get("mode") == "continuous":
        return f"{w.get('running', '?')}/{w.get('max_slots', '?')} slots"
    return f"{float(w.get('window_ms', 0)):.1f} ms"
