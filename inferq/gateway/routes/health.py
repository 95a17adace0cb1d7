"""Probes for orchestrators, outside auth: ``/healthz`` (the process answers) and ``/readyz``
(Redis answers and at least one live worker serves the queue)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from inferq.gateway.schemas import Health, ModelName, Readiness, TaskName
from inferq.gateway.state import State
from inferq.plans import run_async
from inferq.protocol.keys import QueueKeys
from inferq.stats import all_live_workers

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
    keys = QueueKeys.for_model(task or settings.ready_task, model or settings.ready_model,
                               settings.namespace)
    redis, reason = True, None
    try:
        # every shard of the queue: a worker on any of them serves it
        workers = len(await asyncio.wait_for(
            run_async(state.client.redis, all_live_workers(keys)), settings.ready_timeout_s))
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("readyz: redis unavailable: %s", exc)
        workers, redis, reason = 0, False, "redis unavailable"
    if redis and workers == 0:
        reason = f"no live worker on queue {keys.queue}"
    body = Readiness(status="unready" if reason else "ready", queue=keys.queue, redis=redis,
                     live_workers=workers, reason=reason)
    return JSONResponse(body.model_dump(), status_code=503 if reason else 200)
