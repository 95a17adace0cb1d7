"""The ``generate`` worker's statistics: decode steps, tokens, finish reasons, and the
outcomes of its completions; published for ``inferq stats``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from inferq.worker.core.results import Outcomes
from inferq.worker.generate.steploop import StepOutput


@dataclass
class GenerationStats(Outcomes):
    steps: int = 0
    tokens: int = 0
    prefill_tokens: int = 0
    #: Steps that admitted (prefilled) sequences besides decoding the running ones.
    admission_steps: int = 0
    oom_splits: int = 0
    forward_s: float = 0.0
    batch_sum: int = 0
    max_batch: int = 0
    finish: dict[str, int] = field(default_factory=dict)

    def record(self, out: StepOutput) -> None:
        size = len(out.advanced)
        self.steps += 1
        self.tokens += size
        self.prefill_tokens += out.prefill_tokens
        self.admission_steps += out.admitted > 0
        self.forward_s += out.elapsed_s
        self.batch_sum += size
        self.max_batch = max(self.max_batch, size)

    def as_fields(self, running: int, waiting: int) -> dict[str, str]:
        mean = self.batch_sum / self.steps if self.steps else 0.0
        return {
            "mode": "continuous",
            "batches": str(self.steps),
            "steps": str(self.steps),
            "requests": str(self.completed),
            "tokens": str(self.tokens),
            "prefill_tokens": str(self.prefill_tokens),
            "admission_steps": str(self.admission_steps),
            "failed": str(self.failed),
            "refused": str(self.refused),
            "retried": str(self.retried),
            "cancelled": str(self.cancelled),
            "oom_splits": str(self.oom_splits),
            "mean_batch_size": f"{mean:.3f}",
            "max_batch_size": str(self.max_batch),
            "padding_efficiency": "1.0000",
            "forward_s": f"{self.forward_s:.4f}",
            "window_ms": "0",
            "target_batch_size": str(running),
            "running": str(running),
            "waiting": str(waiting),
            "reasons": json.dumps(self.finish),
            "sizes": json.dumps({}),
        }
