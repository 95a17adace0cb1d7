"""Built-in models that need no weights: ``echo`` (no compute, measures queue overhead) and
``sleep`` (a fixed time per batch plus per item, models a GPU for scale-out tests).

Both take ``fail_on=MARKER``: a request whose prompt contains the marker makes the forward
raise, as a poison request would (for chaos and failure-handling tests, with real processes).
``sleep`` also takes ``record=DIR``: before each forward it appends the batch's prompts, one a
line, to ``DIR/<pid>.ran`` (flushed), so a test can tell which requests really started to run,
even on a worker killed mid-forward.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

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
                 fail_on: str | None = None, record: str | None = None,
                 vector: bool = False) -> None:
        super().__init__(fail_on)
        #: Answer a small vector instead of the prompt (an embedding model's shape, for the
        #: OpenAI endpoints of the gateway: the ``batch`` benchmark).
        self.vector = vector
        if batch_ms < 0 or item_ms < 0:
            raise ConfigError(f"sleep model times must be >= 0, got {batch_ms=} {item_ms=}")
        if record is not None and not Path(record).is_dir():
            raise ConfigError(f"sleep model record= must be an existing folder, got {record!r}")
        self.batch_s = batch_ms / 1e3
        self.item_s = item_ms / 1e3
        self.record = record
        self._ran: IO[str] | None = None
        self.model_id = f"builtin-sleep-{batch_ms:g}-{item_ms:g}"

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SleepModel:
        unknown = set(options) - {"batch_ms", "item_ms", "fail_on", "record", "vector"}
        if unknown:
            raise ConfigError(f"unknown sleep model option(s) {sorted(unknown)}; "
                              "known: batch_ms, item_ms, fail_on, record, vector")
        if options.get("vector", "0") not in ("0", "1"):
            raise ConfigError(f"sleep model vector= must be 0 or 1, got {options['vector']!r}")
        try:
            times = {k: float(v) for k, v in options.items()
                     if k not in ("fail_on", "record", "vector")}
        except ValueError as exc:
            raise ConfigError(f"sleep model options must be numbers: {exc}") from exc
        return cls(**times, fail_on=options.get("fail_on"), record=options.get("record"),
                   vector=options.get("vector") == "1")

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        if self.record is not None:
            if self._ran is None:
                self._ran = open(Path(self.record) / f"{os.getpid()}.ran", "a")  # noqa: SIM115
            self._ran.write("".join(f"{item.data}\n" for item in batch))
            self._ran.flush()
        time.sleep(self.batch_s + self.item_s * len(batch))
        self._check(batch)
        if self.vector:
            return [[float(len(item.data)), 1.0] for item in batch]
        return [item.data for item in batch]

    def close(self) -> None:
        if self._ran is not None:
            self._ran.close()
            self._ran = None
        super().close()
