"""Built-in models that need no weights: ``echo`` (no compute, measures queue overhead) and
``sleep`` (a fixed time per batch plus per item, models a GPU for scale-out tests).

Both take ``fail_on=MARKER``: a request whose prompt contains the marker makes the forward
raise, as a poison request would (for chaos and failure-handling tests, with real processes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from inferq.errors import ConfigError, InferqError
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class PoisonError(RuntimeError):
    """Raised by a built-in model for a prompt carrying its ``fail_on`` marker."""


class EchoModel(BatchModel):
    tasks = frozenset({"*"})

    def __init__(self, fail_on: str | None = None) -> None:
        if fail_on == "":
            raise ConfigError("fail_on must be a non-empty marker")
        self.fail_on = fail_on
        self.model_id = "builtin-echo"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> EchoModel:
        unknown = set(options) - {"fail_on"}
        if unknown:
            raise ConfigError(f"unknown echo model option(s) {sorted(unknown)}; known: fail_on")
        return cls(fail_on=options.get("fail_on"))

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        return [ModelInput(_tokens(p.prompt), p.prompt) for p in payloads]

    def _check(self, batch: Sequence[ModelInput]) -> None:
        if self.fail_on is not None and any(self.fail_on in item.data for item in batch):
            raise PoisonError(f"prompt contains the poison marker {self.fail_on!r}")

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        self._check(batch)
        return [item.data for item in batch]


class SleepModel(EchoModel):
    def __init__(self, batch_ms: float = 50.0, item_ms: float = 0.0,
                 fail_on: str | None = None) -> None:
        super().__init__(fail_on)
        if batch_ms < 0 or item_ms < 0:
            raise ConfigError(f"sleep model times must be >= 0, got {batch_ms=} {item_ms=}")
        self.batch_s = batch_ms / 1e3
        self.item_s = item_ms / 1e3
        self.model_id = f"builtin-sleep-{batch_ms:g}-{item_ms:g}"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SleepModel:
        unknown = set(options) - {"batch_ms", "item_ms", "fail_on"}
        if unknown:
            raise ConfigError(f"unknown sleep model option(s) {sorted(unknown)}; "
                              "known: batch_ms, item_ms, fail_on")
        try:
            times = {k: float(v) for k, v in options.items() if k != "fail_on"}
        except ValueError as exc:
            raise ConfigError(f"sleep model options must be numbers: {exc}") from exc
        return cls(**times, fail_on=options.get("fail_on"))

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        time.sleep(self.batch_s + self.item_s * len(batch))
        self._check(batch)
        return [item.data for item in batch]
