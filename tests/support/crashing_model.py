"""A custom model that kills its own worker process (SIGKILL, as a segfault in a native
kernel would) when a prompt of the batch carries the marker, served with
``--model NAME=python:tests.support.crashing_model:CrashingModel?marker=POISON&batch_ms=50``.

Every request it starts is recorded first (``record=DIR``: one line per request, in
``<pid>.ran``), so a test can tell what ran where and what ran alone."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from inferq.models import Model


class CrashingModel(Model):
    tasks = frozenset({"embed"})

    def load(self) -> None:
        self.marker = self.options.get("marker", "POISON")
        self.batch_s = float(self.options.get("batch_ms", "50")) / 1e3
        record = self.options.get("record")
        self._ran: IO[str] | None = (
            open(Path(record) / f"{os.getpid()}.ran", "a") if record else None)  # noqa: SIM115

    def forward(self, batch: Sequence[Any]) -> list[Any]:
        prompts = [str(getattr(item, "data", item)) for item in batch]
        if self._ran is not None:
            self._ran.write("".join(f"{len(prompts)} {p}\n" for p in prompts))
            self._ran.flush()
        time.sleep(self.batch_s)
        if any(self.marker in p for p in prompts):
            os.kill(os.getpid(), signal.SIGKILL)
        return prompts
