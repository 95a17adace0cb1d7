"""A claimed request in the window worker (``Job``: its claim and its model input), and a batch
of them as the window released it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    padding_efficiency: float
    released_at: float
    extra: dict[str, Any] = field(default_factory=dict)
