"""inferq's own request API: create (optionally wait), read, cancel.

A request lives in the queue ``task:model``, so reads and cancels name ``model`` (and
``task``, default ``embed``) next to the id.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from inferq.errors import RequestError, ResultTimeout
from inferq.gateway.caller import Caller, check_priority, new_request_id, tenant_of
from inferq.gateway.limiting import Reservation, reserve, settle_from
from inferq.gateway.routes.common import (
    DeadlineHeader,
    PriorityHeader,
    SloHeader,
    TenantHeader,
)
from inferq.gateway.schemas import ERROR_RESPONSES, CreateRequest, RequestView, ResultView
from inferq.gateway.state import GatewayState, State
from inferq.gateway.tracecontext import trace_fields
from inferq.openai.errors import ApiError, from_inferq
from inferq.openai.schemas import ModelName, TaskName
from inferq.producer.aio import AsyncHandle
from inferq.producer.replies import RequestState
from inferq.protocol.codec import PUBLIC_ID_RE, Result
from inferq.protocol.cost import DEFAULT_MAX_NEW_TOKENS
from inferq.protocol.generation import GENERATE_TASK
from inferq.tenancy.principal import Principal

router = APIRouter(tags=["requests"])

RequestIdPath = Annotated[str, Path(pattern=PUBLIC_ID_RE.pattern)]
ModelQuery = Annotated[ModelName, Query(description="the queue's model")]
TaskQuery = Annotated[TaskName, Query(description="the queue's task")]
WaitQuery = Annotated[bool, Query(description="wait for the result (200) instead of 202")]
TimeoutQuery = Annotated[float | None, Query(gt=0, allow_inf_nan=False,
                                             description="with wait: seconds to wait")]


def view(caller: Principal, handle: AsyncHandle, status: RequestState,
         result: Result | None = None, duplicate: bool | None = None) -> RequestView:
    return RequestView(id=caller.public_id(handle.id), queue=handle.keys.queue, status=status,
                       duplicate=duplicate,
                       result=None if result is None else ResultView.of(result))


def not_found(caller: Principal, handle: AsyncHandle) -> ApiError:
    public = caller.public_id(handle.id)
    return ApiError(404, "not_found_error", "not_found",
                    f"no request {public!r} in queue {handle.keys.queue!r} (never queued, "
                    "or its result expired)", request_id=public)


async def current(caller: Principal, handle: AsyncHandle,
                  duplicate: bool | None = None) -> RequestView:
    """The state now, and the result once there is one (two reads: the SDK has no one call
    that returns both)."""
    status = await handle.status()
    finished = status not in (RequestState.PENDING, RequestState.RUNNING, RequestState.UNKNOWN)
    return view(caller, handle, status, await handle.peek() if finished else None, duplicate)


async def wait_for(state: GatewayState, handle: AsyncHandle, timeout: float) -> Result:
    if not handle.duplicate:
        return await handle.result(timeout)  # over the client's shared inbox
    # Someone else's request: its result is announced in their inbox, so this wait blocks a
    # pooled connection (BLMOVE). Bounded, so such waits cannot starve the pool.
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            await state.blocking_waits.acquire()
    except TimeoutError as exc:
        raise ResultTimeout(f"no result for request {handle.id} within {timeout} s") from exc
    try:
        # The wait itself is bounded by BLMOVE's timeout, not by cancelling it midway.
        return await handle.result(max(0.001, timeout - (time.monotonic() - start)))
    finally:
        state.blocking_waits.release()


@router.post("/v1/requests", status_code=202, response_model=RequestView,
             responses={200: {"model": RequestView, "description": "with wait=true: done"},
                        404: {"description": "unknown request"}, **ERROR_RESPONSES},
             summary="Queue a request")
async def create_request(body: CreateRequest, state: State, caller: Caller, response: Response,
                         x_priority: PriorityHeader = None,
                         x_deadline_s: DeadlineHeader = None,
                         x_inferq_tenant: TenantHeader = None,
                         x_inferq_ttft_slo_ms: SloHeader = None,
                         wait: WaitQuery = False,
                         timeout_s: TimeoutQuery = None) -> RequestView:
    """202 with the id once queued (or, for an existing ``id``, that request's state). With
    ``wait=true``: 200 and the result, or the error that the result stands for (a 504 on
    timeout leaves the request queued: read it later by id)."""
    timeout = state.timeout(timeout_s, "timeout_s")
    priority = check_priority(caller, body.priority if body.priority is not None else (
        x_priority if x_priority is not None else caller.default_priority))
    await state.require_served(body.task, body.model)
    stored_id = new_request_id(caller, body.id)
    max_tokens = (body.params or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    reservation = await reserve(
        state.client.redis, caller, [stored_id] if stored_id is not None else [],
        text_bytes=len(body.prompt.encode("utf-8")), timeout_s=timeout,
        max_tokens=max_tokens if body.task == GENERATE_TASK and isinstance(max_tokens, int)
        else 0, namespace=state.settings.namespace)
    try:
        handle = await state.client.enqueue(
            body.prompt, model=body.model, task=body.task, priority=priority,
            deadline_s=body.deadline_s if body.deadline_s is not None else x_deadline_s,
            id=stored_id, params=body.params, max_attempts=body.max_attempts,
            tenant=tenant_of(caller, state.tenant(body.tenant, x_inferq_tenant)),
            ttft_slo_ms=x_inferq_ttft_slo_ms, **trace_fields())
    except BaseException:
        await reservation.release()
        raise
    response.headers.update(reservation.headers)
    if wait:
        try:
            result = await wait_for(state, handle, timeout)
        except ResultTimeout as exc:
            error = from_inferq(exc)
            error.request_id = caller.public_id(handle.id)  # still queued: read it later
            raise error from exc
        except RequestError:  # finished without an output: settled all the same
            await settle_from(handle, reservation)
            raise
        await reservation.settle([result])
        response.status_code = 200
        return view(caller, handle, RequestState.of(result.status), result, handle.duplicate)
    if not handle.duplicate:
        return view(caller, handle, RequestState.PENDING, duplicate=False)
    return await current(caller, handle, duplicate=True)


@router.get("/v1/requests/{request_id}", response_model=RequestView,
            responses={404: {"description": "unknown request"}, **ERROR_RESPONSES},
            summary="A request's state, with its result once finished")
async def get_request(request_id: RequestIdPath, state: State, caller: Caller,
                      model: ModelQuery, task: TaskQuery = "embed") -> RequestView:
    handle = await state.client.find(caller.stored_id(request_id), model=model, task=task)
    found = await current(caller, handle)
    if found.status is RequestState.UNKNOWN:
        raise not_found(caller, handle)
    if caller.limited and caller.settles and found.result is not None:
        # a request queued without wait is settled when its caller first sees it finished
        await settle_from(handle, Reservation(state.client.redis, caller, [handle.id], {},
                                              state.settings.namespace))
    return found


@router.delete("/v1/requests/{request_id}", response_model=RequestView,
               responses={404: {"description": "unknown request"},
                          409: {"description": "already finished"}, **ERROR_RESPONSES},
               summary="Cancel a queued or running request")
async def cancel_request(request_id: RequestIdPath, state: State, caller: Caller,
                         model: ModelQuery, task: TaskQuery = "embed") -> RequestView:
    handle = await state.client.find(caller.stored_id(request_id), model=model, task=task)
    if await handle.cancel():
        return view(caller, handle, RequestState.CANCELLED, await handle.peek())
    status = await handle.status()
    if status is RequestState.UNKNOWN:
        raise not_found(caller, handle)
    raise ApiError(409, "conflict_error", "already_finished",
                   f"request {request_id!r} already finished with status {status.value!r}",
                   request_id=request_id)
