"""The ``generate`` worker's statistics: tokens, prefills and finish reasons, on top of
``WorkerStats`` (its batches are decode steps)."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.worker.core.stats import WorkerStats
from inferq.worker.generate.steploop import StepOutput


@dataclass
class GenerationStats(WorkerStats):
    tokens: int = 0
    prefill_tokens: int = 0
    #: Steps that admitted (prefilled) sequences besides decoding the running ones.
    admission_steps: int = 0
    oom_splits: int = 0
    #: Times the engine process died and was started again.
    engine_restarts: int = 0

    @property
    def steps(self) -> int:
        return self.batches

    def record(self, out: StepOutput) -> None:
        self.record_batch(len(out.advanced), out.elapsed_s)
        self.tokens += len(out.advanced)
        self.prefill_tokens += out.prefill_tokens
        self.admission_steps += out.admitted > 0

    def as_fields(self, running: int, waiting: int) -> dict[str, str]:
        return {
            **self.fields(),
            "mode": "continuous",
            "steps": str(self.steps),
            "requests": str(self.completed),
            "tokens": str(self.tokens),
            "prefill_tokens": str(self.prefill_tokens),
            "admission_steps": str(self.admission_steps),
            "cancelled": str(self.cancelled),
            "oom_splits": str(self.oom_splits),
            "engine_restarts": str(self.engine_restarts),
            "padding_efficiency": "1.0000",
            "window_ms": "0",
            "target_batch_size": str(running),
            "running": str(running),
            "waiting": str(waiting),
            "sizes": "{}",
        }
