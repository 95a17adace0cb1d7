"""What became of the completions a worker sent: counted for its stats hash (``inferq stats``)
and its metrics. Each worker's own statistics extend ``Outcomes``."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from inferq.protocol import ops
from inferq.worker.core.metrics import WorkerMetrics

log = logging.getLogger("inferq.worker")


@dataclass
class Outcomes:
    #: Results written with status ``ok``.
    completed: int = 0
    failed: int = 0
    refused: int = 0
    released: int = 0
    retried: int = 0
    cancelled: int = 0

    def count(self, metrics: WorkerMetrics, completions: Sequence[ops.Completion],
              written: Sequence[bool], cancelled: Collection[str] = ()) -> None:
        """``written``: what the server did with each completion; a refused one in
        ``cancelled`` was cancelled by its producer (not a lost lease)."""
        for completion, ok in zip(completions, written, strict=True):
            if not ok and completion.id in cancelled:
                self.cancelled += 1
                continue
            metrics.observe_outcome(completion.status, ok)
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
