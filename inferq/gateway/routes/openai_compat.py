"""OpenAI-compatible routes: ``POST /v1/embeddings`` (the official ``openai`` client works
against it). ``/v1/chat/completions`` and ``/v1/completions`` are in ``completions``."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from inferq.errors import QueueFull
from inferq.gateway.caller import Caller, check_priority, tenant_of
from inferq.gateway.coalesce import cancel_quietly
from inferq.gateway.limiting import reserve
from inferq.gateway.routes.common import (
    DeadlineHeader,
    InputFailed,
    PriorityHeader,
    SloHeader,
    TenantHeader,
    TimeoutHeader,
    wait_all,
)
from inferq.gateway.schemas import ERROR_RESPONSES
from inferq.gateway.state import GatewayState, State
from inferq.gateway.tracecontext import trace_fields
from inferq.openai.errors import ApiError, from_inferq
from inferq.openai.jsonenc import dumps
from inferq.openai.requests import embedding_texts, embeddings_fields
from inferq.openai.responses import embeddings_body, embeddings_tokens
from inferq.openai.schemas import EmbeddingsRequest, EmbeddingsResponse
from inferq.tenancy.principal import Principal

router = APIRouter(tags=["openai"])


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES,
             summary="Create embeddings (OpenAI-compatible)")
async def create_embeddings(body: EmbeddingsRequest, state: State, caller: Caller,
                            x_priority: PriorityHeader = None,
                            x_deadline_s: DeadlineHeader = None,
                            x_timeout_s: TimeoutHeader = None,
                            x_inferq_tenant: TenantHeader = None,
                            x_inferq_ttft_slo_ms: SloHeader = None) -> Response:
    """Queues every input (task ``embed``) in one round trip and waits for all of them. If one
    fails or the wait times out, the others are cancelled and the call fails as a whole."""
    return await embeddings_response(state, body, caller, x_priority, x_deadline_s, x_timeout_s,
                                     x_inferq_tenant, x_inferq_ttft_slo_ms)


async def embeddings_response(state: GatewayState, body: EmbeddingsRequest, caller: Principal,
                              x_priority: int | None = None, x_deadline_s: float | None = None,
                              x_timeout_s: float | None = None,
                              x_tenant: str | None = None,
                              ttft_slo_ms: int | None = None) -> Response:
    """The work of ``POST /v1/embeddings``, shared by the route and the gateway's fast path
    (``inferq.gateway.fastpath``): raises ``ApiError`` or an ``InferqError`` on failure."""
    settings = state.settings
    texts = embedding_texts(body)
    if len(texts) > settings.max_embedding_inputs:
        raise ApiError(422, "invalid_request_error", "invalid_request",
                       f"input: at most {settings.max_embedding_inputs} texts per call, "
                       f"got {len(texts)}", param="input")
    max_bytes = state.client.options.limits.max_prompt_bytes
    sizes = [len(text.encode("utf-8")) for text in texts]
    for i, size in enumerate(sizes):
        if size > max_bytes:
            raise ApiError(422, "invalid_request_error", "payload_too_large",
                           f"input[{i}]: longer than {max_bytes} bytes", param=f"input[{i}]")
    timeout = state.timeout(x_timeout_s, "X-Timeout-S")
    priority = check_priority(caller, body.priority if body.priority is not None else (
        x_priority if x_priority is not None else caller.default_priority))
    deadline_s = body.deadline_s if body.deadline_s is not None else x_deadline_s
    await state.require_served("embed", body.model)
    # Reservations of the call's own (its requests' ids are made when they are queued).
    call = uuid.uuid4().hex
    reservation = await reserve(
        state.client.redis, caller,
        [f"{call}:{i}" for i in range(len(texts))] if caller.limited else [],
        text_bytes=sum(sizes), timeout_s=timeout,
        namespace=settings.namespace)
    try:
        handles = await state.enqueue_many(
            texts, **embeddings_fields(body), priority=priority, deadline_s=deadline_s,
            tenant=tenant_of(caller, state.tenant(body.user, x_tenant)),
            ttft_slo_ms=ttft_slo_ms, **trace_fields())
    except QueueFull as exc:
        # Some inputs may have got in before the queue filled: all or nothing.
        await cancel_quietly(exc.accepted)
        await reservation.release()
        raise
    except BaseException:
        await reservation.release()
        raise
    try:
        results = await wait_all(handles, timeout)
    except InputFailed as exc:
        await reservation.release()
        raise from_inferq(exc.error, param=f"input[{exc.index}]") from exc
    except BaseException:
        await reservation.release()
        raise
    await reservation.settle(results)
    response = embeddings_body(body.model, [r.output for r in results], embeddings_tokens(sizes),
                               body.encoding_format == "base64")
    return Response(dumps(response), media_type="application/json",
                    headers={"X-Inferq-Usage": "estimated", **reservation.headers})
