"""The interface between the worker loop and a model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferq.errors import InferqError
from inferq.protocol.codec import RequestPayload


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One request after decoding and tokenizing: ``tokens`` is its length, ``data`` whatever
    the model's ``forward`` wants (token ids for a transformer)."""

    tokens: int
    data: Any
    #: The input was longer than the model takes and was cut (the result says ``truncated``).
    truncated: bool = False


class BatchModel(ABC):
    """A model that runs batches. ``prepare`` runs on a helper thread while the previous batch
    is in ``forward``; ``forward`` runs on the model thread. Neither touches Redis."""

    #: Stable identity of the weights, used to key the persisted adaptive-window state.
    model_id: str
    #: Tasks this model serves (``"*"`` for any).
    tasks: frozenset[str]
    device: str = "cpu"

    def supports(self, task: str) -> bool:
        return "*" in self.tasks or task in self.tasks

    @abstractmethod
    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        """Tokenize each payload; a payload it cannot take gets an error in its slot."""

    @abstractmethod
    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        """Outputs (msgpack-serialisable) in the same order as ``batch``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release device memory; called once at worker shutdown."""
