"""The window worker's batch statistics, published to Redis for ``inferq stats``."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from inferq.worker.core.results import Outcomes


@dataclass
class WorkerStats(Outcomes):
    batches: int = 0
    #: Requests run in batches (whatever their outcome).
    requests: int = 0
    forward_s: float = 0.0
    real_tokens: int = 0
    padded_tokens: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    sizes: Counter[int] = field(default_factory=Counter)

    def record_batch(self, size: int, reason: str, real_tokens: int, padded_tokens: int,
                     forward_s: float) -> None:
        self.batches += 1
        self.requests += size
        self.sizes[size] += 1
        self.reasons[reason] += 1
        self.real_tokens += real_tokens
        self.padded_tokens += padded_tokens
        self.forward_s += forward_s

    @property
    def mean_batch_size(self) -> float:
        return self.requests / self.batches if self.batches else 0.0

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def as_fields(self) -> dict[str, str]:
        return {
            "batches": str(self.batches),
            "requests": str(self.requests),
            "failed": str(self.failed),
            "refused": str(self.refused),
            "retried": str(self.retried),
            "mean_batch_size": f"{self.mean_batch_size:.3f}",
            "max_batch_size": str(max(self.sizes, default=0)),
            "padding_efficiency": f"{self.padding_efficiency:.4f}",
            "forward_s": f"{self.forward_s:.4f}",
            "reasons": json.dumps(dict(self.reasons)),
            "sizes": json.dumps({str(k): v for k, v in sorted(self.sizes.items())}),
        }
