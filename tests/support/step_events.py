"""A ``StepEvents`` that records what a step loop reports, for tests that drive ``StepLoop``
without a worker."""

from __future__ import annotations

import threading

from inferq.worker.core.failures import Failure
from inferq.worker.generate.engine import Generation


class RecordingEvents:
    def __init__(self) -> None:
        self.errors: list[tuple[Exception | Failure, list[Generation]]] = []
        self.ooms: list[int] = []
        self.left_batches: list[list[Generation]] = []
        self.capacity_changes = 0
        #: Set by ``outputs_ready`` and ``step_failed``: something to collect.
        self.changed = threading.Event()
        self.lost: set[str] = set()
        self.loop_errors: list[BaseException] = []

    def outputs_ready(self) -> None:
        self.changed.set()

    def step_failed(self, error: Exception | Failure, victims: list[Generation]) -> None:
        self.errors.append((error, victims))
        self.changed.set()

    def left(self, gone: list[Generation]) -> None:
        self.left_batches.append(gone)

    def capacity_changed(self) -> None:
        self.capacity_changes += 1

    def out_of_memory(self, sequences: int) -> None:
        self.ooms.append(sequences)

    def is_lost(self, request_id: str) -> bool:
        return request_id in self.lost

    def loop_failed(self, error: BaseException) -> None:
        self.loop_errors.append(error)
        self.changed.set()
