"""An in-process window worker (``inferq.worker.window.worker.WindowWorker``) on the queue
``embed:t`` (``KEYS``)."""

from __future__ import annotations

import asyncio
from typing import Any

from inferq.connection import ConnectionSettings
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import WorkerConfig
from inferq.worker.window.worker import WindowWorker

KEYS = QueueKeys.for_model("embed", "t")


def config(url: str, **kw: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(connection=ConnectionSettings(url), model_name="t",
                                model_spec="builtin:test",
                                max_batch_size=8, max_wait_ms=5, lease_ms=5_000,
                                worker_id="test-worker")
    base.update(kw)
    return WorkerConfig(**base)


async def run_worker(worker: WindowWorker) -> asyncio.Task[int]:
    return asyncio.create_task(worker.run(install_signal_handlers=False))


async def stop(worker: WindowWorker, task: asyncio.Task[int]) -> None:
    worker.request_stop()
    await asyncio.wait_for(task, timeout=30)
