"""The window worker's statistics: batch sizes and padding, on top of ``WorkerStats``."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from inferq.worker.core.stats import WorkerStats
from inferq.worker.window.batch import Batch


@dataclass
class WindowStats(WorkerStats):
    real_tokens: int = 0
    padded_tokens: int = 0
    sizes: Counter[int] = field(default_factory=Counter)
    #: Suspects given back so that other workers isolate them in parallel.
    suspects_shared: int = 0
    #: Model idle time from the end of a forward to the start of the next, counted when
    #: claimed requests were already waiting at that end (the next window's decode and
    #: tokenization ran during the forward; this is what is left to do after it).
    handoffs: int = 0
    handoff_s: float = 0.0

    def record_handoff(self, seconds: float) -> None:
        self.handoffs += 1
        self.handoff_s += seconds

    def record(self, batch: Batch, forward_s: float) -> None:
        self.record_batch(len(batch.jobs), forward_s)
        self.sizes[len(batch.jobs)] += 1
        self.reasons[batch.reason.value] += 1
        self.real_tokens += batch.real_tokens
        self.padded_tokens += batch.padded_tokens

    def as_fields(self) -> dict[str, str]:
        efficiency = self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0
        return {**self.fields(), "requests": str(self.batched),
                "padding_efficiency": f"{efficiency:.4f}",
                "suspects_shared": str(self.suspects_shared),
                "handoffs": str(self.handoffs),
                "handoff_s": f"{self.handoff_s:.6f}",
                "sizes": json.dumps({str(k): v for k, v in sorted(self.sizes.items())})}
