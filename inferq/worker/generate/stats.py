"""The ``generate`` worker's statistics: tokens, prefills and finish reasons, on top of
``WorkerStats`` (its batches are decode steps)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from inferq.worker.core.stats import WorkerStats
from inferq.worker.generate.steploop import StepOutput
from inferq.worker.window.policy import LatencyModel


@dataclass
class GenerationStats(WorkerStats):
    tokens: int = 0
    prefill_tokens: int = 0
    #: Steps that admitted (prefilled) sequences besides decoding the running ones.
    admission_steps: int = 0
    oom_splits: int = 0
    #: Times the engine process died and was started again.
    engine_restarts: int = 0
    #: Running generations pushed out of the batch for a higher priority (each resumed later).
    preemptions: int = 0
    #: Reads of the head of pending by this worker while its device was full.
    head_reads: int = 0
    #: Recent requests' ``StreamClaim.first_text_lag``: engine steps between the step that
    #: made a stream's first text and its hand-over to the publisher.
    first_text_lags: deque[int] = field(default_factory=lambda: deque(maxlen=1024))
    #: Decode steps' time by the sequences they advanced (``a·n + b``), fitted on the steps
    #: that admitted none: the decode capacity at the slot count, ``S / (a·S + b)`` tokens a
    #: second, that admission and autoscaling read (``inferq.protocol.slo``).
    decode: LatencyModel = field(default_factory=lambda: LatencyModel(decay=0.999))
    #: Time the admitting steps spent beyond their decode (by the fit): prefill time.
    prefill_s: float = 0.0

    @property
    def steps(self) -> int:
        return self.batches

    def record(self, out: StepOutput) -> None:
        self.preemptions += len(out.preempted)
        if not out.advanced:
            return
        self.record_batch(len(out.advanced), out.elapsed_s)
        if out.admitted:
            decoding = self.decode.predict(len(out.advanced)) if self.decode.fitted else 0.0
            self.prefill_s += max(out.elapsed_s - decoding, 0.0)
        else:
            self.decode.observe(len(out.advanced), out.elapsed_s)
        self.tokens += len(out.advanced)
        self.prefill_tokens += out.prefill_tokens
        self.admission_steps += out.admitted > 0

    def capacity_fields(self) -> dict[str, str]:
        """The measured decode fit and prefill rate, once there is something measured."""
        fields = {}
        if self.decode.fitted:
            fields["decode_a_ms"] = f"{self.decode.a * 1e3:.6g}"
            fields["decode_b_ms"] = f"{self.decode.b * 1e3:.6g}"
        if self.prefill_s > 0 and self.prefill_tokens > 0:
            fields["prefill_tokens_per_s"] = f"{self.prefill_tokens / self.prefill_s:.6g}"
        return fields

    def as_fields(self, running: int, waiting: int) -> dict[str, str]:
        return {
            **self.capacity_fields(),
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
            "preemptions": str(self.preemptions),
            "padding_efficiency": "1.0000",
            "window_ms": "0",
            "target_batch_size": str(running),
            "running": str(running),
            "waiting": str(waiting),
            "sizes": "{}",
        }
