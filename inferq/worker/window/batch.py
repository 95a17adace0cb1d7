"""A claimed request in the window worker (``Job``: its claim and its model input), and a batch
of them as the window released it."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.worker.core.results import Claim
from inferq.worker.models.base import ModelInput
from inferq.worker.window.policy import ReleaseReason


@dataclass(slots=True)
class Job(Claim):
    input: ModelInput

    @property
    def tokens(self) -> int:
        return self.input.tokens


@dataclass(slots=True)
class Batch:
    id: int
    jobs: list[Job]
    reason: ReleaseReason
    real_tokens: int
    padded_tokens: int

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0
