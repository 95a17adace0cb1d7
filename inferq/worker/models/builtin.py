"""Built-in models that need no weights: ``echo`` (no compute, measures queue overhead) and
``sleep`` (a fixed time per batch plus per item, models a GPU for scale-out tests)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferq.errors import ConfigError, InferqError
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class EchoModel(BatchModel):
    tasks = frozenset({"*"})

    def __init__(self) -> None:
        self.model_id = "builtin-echo"

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        return [ModelInput(_tokens(p.prompt), p.prompt) for p in payloads]

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        return [item.data for item in batch]


class SleepModel(BatchModel):
    tasks = frozenset({"*"})

    def __init__(self, batch_ms: float = 50.0, item_ms: float = 0.0) -> None:
        if batch_ms < 0 or item_ms < 0:
            raise ConfigError(f"sleep model times must be >= 0, got {batch_ms=} {item_ms=}")
        self.batch_s = batch_ms / 1e3
        self.item_s = item_ms / 1e3
        self.model_id = f"builtin-sleep-{batch_ms:g}-{item_ms:g}"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SleepModel:
        unknown = set(options) - {"batch_ms", "item_ms"}
        if unknown:
            raise ConfigError(f"unknown sleep model option(s) {sorted(unknown)}; "
                              "known: batch_ms, item_ms")
        try:
            return cls(**{k: float(v) for k, v in options.items()})
        except ValueError as exc:
            raise ConfigError(f"sleep model options must be numbers: {exc}") from exc

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        return [ModelInput(_tokens(p.prompt), p.prompt) for p in payloads]

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        time.sleep(self.batch_s + self.item_s * len(batch))
        return [item.data for item in batch]
