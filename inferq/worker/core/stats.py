"""What a worker counts for its stats hash (``inferq stats``) and its metrics: what became of
the completions it sent, and the batches it ran (a ``generate`` worker's are decode steps).
Each worker's statistics extend ``WorkerStats``."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from inferq.protocol import ops, slo
from inferq.worker.core.metrics import WorkerMetrics

log = logging.getLogger("inferq.worker")


@dataclass
class WorkerStats:
    #: Results written with status ``ok``.
    completed: int = 0
    failed: int = 0
    refused: int = 0
    released: int = 0
    retried: int = 0
    cancelled: int = 0
    #: Batches run, the requests in them summed, the largest, and the forward time.
    batches: int = 0
    batched: int = 0
    max_batch: int = 0
    forward_s: float = 0.0
    #: Finished requests with a latency objective that met it, and that missed it.
    slo_met: int = 0
    slo_missed: int = 0
    #: The prediction's error of the requests admission admitted (actual / predicted time to
    #: the result or first token), counted per ``slo.RATIO_BUCKETS`` bucket.
    slo_ratio: list[int] = field(
        default_factory=lambda: [0] * (len(slo.RATIO_BUCKETS) + 1))
    #: Why batches were released (window) or generations finished (generate).
    reasons: Counter[str] = field(default_factory=Counter)

    def count(self, metrics: WorkerMetrics, completions: Sequence[ops.Completion],
              written: Sequence[bool], cancelled: Collection[str] = ()) -> None:
        """``written``: what the server did with each completion; a refused one in
        ``cancelled`` was cancelled by its producer (not a lost lease)."""
        tally: Counter[tuple[str, bool]] = Counter()
        goodput: Counter[bool] = Counter()
        for completion, ok in zip(completions, written, strict=True):
            if not ok and completion.id in cancelled:
                self.cancelled += 1
                continue
            tally[completion.status, ok] += 1
            if ok and completion.slo_met is not None:
                goodput[completion.slo_met] += 1
            if ok and completion.predicted_ratio is not None:
                self.slo_ratio[slo.ratio_bucket(completion.predicted_ratio)] += 1
                metrics.slo_ratio.labels(metrics.queue).observe(completion.predicted_ratio)
            if not ok:
                self.refused += 1
                log.warning("completion of %s refused: lease lost or request cancelled",
                            completion.id)
            elif completion.status == "retry":
                self.retried += 1
            elif completion.status == "ok":
                self.completed += 1
            else:
                self.failed += 1
        for (status, ok), n in tally.items():
            metrics.observe_outcome(status, ok, n)
        for met, n in goodput.items():
            metrics.slo_met.labels(metrics.queue, "true" if met else "false").inc(n)
        self.slo_met += goodput[True]
        self.slo_missed += goodput[False]

    def record_batch(self, size: int, forward_s: float) -> None:
        self.batches += 1
        self.batched += size
        self.max_batch = max(self.max_batch, size)
        self.forward_s += forward_s

    def fields(self) -> dict[str, str]:
        """The stats hash fields both workers publish."""
        mean = self.batched / self.batches if self.batches else 0.0
        return {
            "batches": str(self.batches),
            "failed": str(self.failed),
            "refused": str(self.refused),
            "retried": str(self.retried),
            "mean_batch_size": f"{mean:.3f}",
            "max_batch_size": str(self.max_batch),
            "forward_s": f"{self.forward_s:.4f}",
            "reasons": json.dumps(dict(self.reasons)),
            "slo_met": str(self.slo_met),
            "slo_missed": str(self.slo_missed),
            "slo_ratio": " ".join(map(str, self.slo_ratio)),
        }
