"""Headers and helpers shared by the routes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated

from fastapi import Header

from inferq.errors import RequestError
from inferq.gateway.coalesce import cancel_quietly
from inferq.producer.aio import AsyncHandle
from inferq.protocol.codec import PUBLIC_ID_RE, Result
from inferq.protocol.prefix import SESSION_RE
from inferq.protocol.scores import MAX_SLO_MS, PRIORITY_MAX, PRIORITY_MIN

PriorityHeader = Annotated[int | None, Header(
    alias="X-Priority", ge=PRIORITY_MIN, le=PRIORITY_MAX,
    description="priority when the body has none")]
DeadlineHeader = Annotated[float | None, Header(
    alias="X-Deadline-S", gt=0, allow_inf_nan=False,
    description="relative deadline (s) when the body has none")]
TenantHeader = Annotated[str | None, Header(
    alias="X-Inferq-Tenant",
    description="the tenant (fair shares) when INFERQ_GATEWAY_TENANT_FROM=header")]
RequestIdHeader = Annotated[str | None, Header(
    alias="X-Request-Id", pattern=PUBLIC_ID_RE.pattern,
    description="the request's id (echoed): the client knows it before the first byte, to "
                "resume a stream or read the request; an id already queued is that request")]
SloHeader = Annotated[int | None, Header(
    alias="X-Inferq-TTFT-SLO-Ms", ge=1, le=MAX_SLO_MS,
    description="the latency objective (ms from enqueue to the first token, or the result): "
                "Result.slo_met; the queue may order by it and refuse (429) what would miss it")]
SessionHeader = Annotated[str | None, Header(
    alias="X-Session-Id", pattern=SESSION_RE.pattern,
    description="the conversation a generation belongs to: cache affinity prefers the worker "
                "that ran its earlier turns (docs/guides/cache-affinity.md)")]
TimeoutHeader = Annotated[float | None, Header(
    alias="X-Timeout-S", gt=0, allow_inf_nan=False,
    description="how long to wait for the result (s); default INFERQ_GATEWAY_TIMEOUT_S")]


class InputFailed(Exception):
    """One of several awaited requests ended without an output; ``index`` says which."""

    def __init__(self, index: int, error: RequestError) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


async def wait_all(handles: Sequence[AsyncHandle], timeout: float) -> list[Result]:
    """Every result, in order. If any request fails, times out, or this call is cancelled
    (client gone, shutdown), the requests still outstanding are cancelled in the queue, so
    no worker computes what nobody will read."""
    tasks = [asyncio.ensure_future(h.result(timeout)) for h in handles]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException as exc:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cancel_quietly(handles)
        if isinstance(exc, RequestError):
            index = next(i for i, h in enumerate(handles) if h.id == exc.result.id)
            raise InputFailed(index, exc) from exc
        raise
