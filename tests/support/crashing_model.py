"""A custom model that kills its own worker process (SIGKILL, as a segfault in a native
kernel would) when a prompt of the batch carries the marker, served with
``--model NAME=python:tests.support.crashing_model:CrashingModel?marker=CRASH``.

Options (all optional): ``marker`` (default ``POISON``); ``batch_ms`` and ``item_ms``, the
forward's time (``batch_ms + item_ms * size``, default 50 and 0); ``fail_on``, a marker that
makes the forward raise instead (a model error, retried within the request's attempts);
``record=DIR``: every request it starts is recorded first (one line per request,
``<batch size> <prompt>``, in ``DIR/<pid>.ran``), so a test can tell what ran where and what
ran alone; ``DIR/<pid>.starts`` has the same lines behind the wall-clock ms of the start
(``<ms> <batch size> <prompt>``), for timelines."""

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
        self.fail_on = self.options.get("fail_on")
        self.batch_s = float(self.options.get("batch_ms", "50")) / 1e3
        self.item_s = float(self.options.get("item_ms", "0")) / 1e3
        record = self.options.get("record")
        self._ran: IO[str] | None = (
            open(Path(record) / f"{os.getpid()}.ran", "a") if record else None)  # noqa: SIM115
        self._starts: IO[str] | None = (
            open(Path(record) / f"{os.getpid()}.starts", "a") if record else None)  # noqa: SIM115

    def forward(self, batch: Sequence[Any]) -> list[Any]:
        prompts = [str(getattr(item, "data", item)) for item in batch]
        if self._ran is not None and self._starts is not None:
            lines = [f"{len(prompts)} {p}\n" for p in prompts]
            self._ran.write("".join(lines))
            self._ran.flush()
            stamp = f"{time.time() * 1e3:.0f} "
            self._starts.write("".join(stamp + line for line in lines))
            self._starts.flush()
        time.sleep(self.batch_s + self.item_s * len(prompts))
        if any(self.marker in p for p in prompts):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fail_on is not None and any(self.fail_on in p for p in prompts):
            raise RuntimeError(f"prompt contains the poison marker {self.fail_on!r}")
        return prompts
