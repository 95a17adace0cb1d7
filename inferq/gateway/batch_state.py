"""What the Files and Batches routes share: the file store, the file and batch services, and
this process's batch runner (started with the app, stopped with it)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from inferq.batch.batches import Batches
from inferq.batch.config import BatchConfig
from inferq.batch.files import Files
from inferq.batch.keys import Index
from inferq.batch.runner import BatchRunner
from inferq.batch.store import FileStore
from inferq.gateway.settings import GatewaySettings
from inferq.producer.aio import AsyncClient


def batch_config(settings: GatewaySettings) -> BatchConfig:
    return BatchConfig(priority=settings.batch_priority, lease_s=settings.batch_lease_s,
                       chunk=settings.batch_chunk,
                       max_outstanding=settings.batch_max_outstanding,
                       min_outstanding=min(64, settings.batch_max_outstanding),
                       idle_s=settings.batch_idle_s, max_file_bytes=settings.max_file_bytes,
                       max_batch_bytes=settings.max_batch_bytes,
                       max_batch_lines=settings.max_batch_lines,
                       max_line_bytes=settings.max_batch_line_bytes)


@dataclass
class BatchState:
    files: Files
    batches: Batches
    runner: BatchRunner | None = None
    task: asyncio.Task[None] | None = field(default=None)

    @classmethod
    def open(cls, settings: GatewaySettings, client: AsyncClient) -> BatchState:
        store = FileStore(settings.file_store, settings.file_store_options)
        index = Index(settings.namespace)
        files = Files(client.redis, store, index)
        batches = Batches(client.redis, files, batch_config(settings), settings.namespace)
        state = cls(files=files, batches=batches)
        if settings.batch_runner:
            state.runner = BatchRunner(batches, client)
            state.task = asyncio.create_task(state.runner.run(), name="inferq-batch-runner")
        return state

    async def close(self) -> None:
        if self.runner is not None and self.task is not None:
            self.runner.stop()
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def get_batch_state(request: Request) -> BatchState:
    state = request.app.state.batch
    assert isinstance(state, BatchState), "the gateway's lifespan did not run"
    return state


BatchDep = Annotated[BatchState, Depends(get_batch_state)]
