"""What the step loop (and the engine process standing in for it) tells whoever drives it.

One interface instead of a callable per event: the worker implements it once (each method
hands the event to its event loop), the engine process implements it to send messages down
its pipe, and tests implement it to record. Every method but ``is_lost`` is called from the
thread that runs the steps (or the engine process' pipe reader): implementations return at
once and never block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from inferq.worker.core.failures import Failure
    from inferq.worker.generate.engine import Generation
    from inferq.worker.generate.scheduler import Budget


class StepEvents(Protocol):
    def outputs_ready(self) -> None:
        """Step outputs are waiting for ``take_outputs`` (called only when it was armed)."""

    def step_failed(self, error: Exception | Failure, victims: list[Generation]) -> None:
        """A step failed for these sequences (they left the batch for good)."""

    def left(self, gone: list[Generation]) -> None:
        """These sequences left because they were cancelled or their lease was lost."""

    def capacity_changed(self) -> None:
        """Slots are about to be free (or the budget grew back): claim."""

    def out_of_memory(self, sequences: int) -> None:
        """The device ran out of memory with this many sequences; the budget shrank."""

    def is_lost(self, request_id: str) -> bool:
        """Whether this request's lease is gone (it leaves at the next step boundary)."""

    def loop_failed(self, error: BaseException) -> None:
        """The step loop itself raised (a bug, not a failed step): it has stopped for good,
        and whatever drives it must not wait for it."""


class EngineEvents(StepEvents, Protocol):
    """A step loop in an engine process also reports its start and its end."""

    def ready(self, budget: Budget) -> None:
        """The engine process loaded the weights and sized this budget (its pipe reader calls
        this before ``capacity`` may say more than 0)."""

    def died(self, why: str, started: list[Generation], unstarted: list[Generation]) -> None:
        """The engine process ended unasked; it is being started again."""
