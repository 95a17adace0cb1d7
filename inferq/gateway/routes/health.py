"""Probes for orchestrators, outside auth: ``/healthz`` (the process answers) and ``/readyz``
(Redis answers and at least one live worker serves the queue)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from inferq.gateway.schemas import Health, Readiness
from inferq.gateway.state import State
from inferq.openai.schemas import ModelName, TaskName
from inferq.protocol.keys import QueueKeys

router = APIRouter(tags=["health"])
log = logging.getLogger("inferq.gateway")


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health()


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness, "description": "not ready"}},
            summary="Readiness: Redis reachable and a live worker on the queue")
async def readyz(state: State, model: Annotated[ModelName | None, Query()] = None,
                 task: Annotated[TaskName | None, Query()] = None) -> JSONResponse:
    """``?model=&task=`` name the queue; default ``INFERQ_GATEWAY_READY_MODEL``/``_TASK``."""
    settings = state.settings
    task, model = task or settings.ready_task, model or settings.ready_model
    keys = QueueKeys.for_model(task, model, settings.namespace)
    redis, reason = True, None
    try:
        # every shard of the queue: a worker on any of them serves it
        workers = len(await asyncio.wait_for(state.client.live_workers(model=model, task=task),
                                             settings.ready_timeout_s))
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("readyz: redis unavailable: %s", exc)
        workers, redis, reason = 0, False, "redis unavailable"
    if redis and workers == 0:
        reason = f"no live worker on queue {keys.queue}"
    body = Readiness(status="unready" if reason else "ready", queue=keys.queue, redis=redis,
                     live_workers=workers, reason=reason)
    return JSONResponse(body.model_dump(), status_code=503 if reason else 200)
