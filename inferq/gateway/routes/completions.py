"""OpenAI-compatible text generation: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

Each call queues one ``generate`` request (``prompt``, or chat ``messages`` rendered with the
model's chat template on the worker) and answers with its text, finish reason and token usage,
or with ``stream: true`` relays the worker's text deltas as server-sent events of chunks, ending
with ``data: [DONE]``. A stream whose client goes away, or whose wait times out, cancels its
request, so no worker keeps generating what nobody reads (unless the body says
``resumable: true``). A request that ends in an error mid-stream sends one
``data: {"error": {...}}`` event (the OpenAI SDK raises it) and stops.

Resumable streams. Every event carries an ``id:``: the Redis Stream entry that holds its text
(``0-0`` for the chat's first, role-only chunk), and ``<last entry>:f`` / ``:u`` / ``:d`` for
the finish chunk, the usage chunk and ``[DONE]``. Ids are sent when the client can use them:
a ``resumable: true`` body, an ``Accept: text/event-stream`` header (what SSE clients send), and
always on the resume route; not otherwise, because some clients (vLLM's benchmark client)
read every event as ``data: `` + JSON and fail on any other field. A client that lost the
stream (its connection, or the gateway process, died) sends the last id it got as
``Last-Event-ID`` to ``GET /v1/requests/{id}/stream`` on any gateway and gets the events after
it, read from the request's Redis Stream: no event twice, none missing. ``X-Request-Id``, when
given, is the request's id (and echoed), so the client knows it before the first byte. A
``Last-Event-ID`` past the stream's end is a 416 (numbers XREAD refuses, a 422), before the 200.

Open streams are read by the gateway's one multiplexed reader (``inferq.gateway.streams``),
never on the pool the other routes use, and capped per gateway and per tenant: a stream over
either cap is a 429 with ``Retry-After``, before its request is queued.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Header, Query, Response

from inferq.errors import RequestError, ResultTimeout
from inferq.gateway.caller import Caller, check_priority, new_request_id, tenant_of
from inferq.gateway.coalesce import cancel_quietly
from inferq.gateway.limiting import reserve, settle_from
from inferq.gateway.routes.common import (
    DeadlineHeader,
    PriorityHeader,
    RequestIdHeader,
    SessionHeader,
    SloHeader,
    TenantHeader,
    TimeoutHeader,
)
from inferq.gateway.routes.native import ModelQuery, RequestIdPath, not_found, wait_for
from inferq.gateway.schemas import ERROR_RESPONSES
from inferq.gateway.sse import Chunks, Position, stream_response
from inferq.gateway.state import GatewayState, State
from inferq.gateway.tracecontext import trace_fields
from inferq.openai.errors import from_inferq
from inferq.openai.requests import generation_request, text_bytes
from inferq.openai.responses import chat_response, completion_response, response_id
from inferq.openai.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from inferq.producer.aio import AsyncHandle
from inferq.producer.replies import RequestState
from inferq.protocol.codec import Result
from inferq.protocol.cost import DEFAULT_MAX_NEW_TOKENS
from inferq.protocol.generation import GENERATE_TASK
from inferq.tenancy.principal import Principal

router = APIRouter(tags=["openai"])

STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "JSON, or with stream=true server-sent events of chunks",
          "content": {"text/event-stream": {}}},
    **ERROR_RESPONSES,
}


async def cancel_shielded(handle: AsyncHandle) -> None:
    # Runs while the route is being cancelled (client gone): shielded, or it never would.
    with anyio.CancelScope(shield=True):
        await cancel_quietly([handle])


async def enqueue(state: GatewayState, caller: Principal,
                  body: ChatCompletionRequest | CompletionRequest,
                  priority: int | None, deadline_s: float | None,
                  stored_id: str | None = None, tenant: str | None = None,
                  ttft_slo_ms: int | None = None, session: str | None = None) -> AsyncHandle:
    """Queues the call's request under ``stored_id`` (``new_request_id``)."""
    request = generation_request(body)
    chosen = check_priority(caller, body.priority if body.priority is not None else (
        priority if priority is not None else caller.default_priority))
    await state.require_served(GENERATE_TASK, body.model)
    return await state.client.enqueue(
        request.prompt, **request.fields, priority=chosen,
        deadline_s=body.deadline_s if body.deadline_s is not None else deadline_s,
        id=stored_id, tenant=tenant_of(caller, state.tenant(body.user, tenant)),
        ttft_slo_ms=ttft_slo_ms, session=state.session(body.user, session),
        **trace_fields())


async def wait(state: GatewayState, caller: Principal, handle: AsyncHandle,
               timeout: float) -> Result:
    """The ok result; a timeout (or this call being cancelled) cancels the request (not one
    that an earlier call with the same ``X-Request-Id`` queued: it is not this call's)."""
    try:
        return await wait_for(state, handle, timeout)
    except RequestError:
        raise  # finished: nothing to cancel
    except ResultTimeout as exc:
        if not handle.duplicate:
            await cancel_shielded(handle)
        error = from_inferq(exc)
        error.request_id = caller.public_id(handle.id)
        raise error from exc
    except BaseException:
        if not handle.duplicate:
            await cancel_shielded(handle)
        raise


# --- routes --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Headers:
    """The optional headers of both routes."""

    priority: int | None = None
    deadline_s: float | None = None
    timeout_s: float | None = None
    request_id: str | None = None
    #: The client's Accept header names ``text/event-stream``.
    event_stream: bool = False
    #: X-Inferq-Tenant (used when INFERQ_GATEWAY_TENANT_FROM=header).
    tenant: str | None = None
    #: X-Inferq-TTFT-SLO-Ms: the latency objective.
    ttft_slo_ms: int | None = None
    #: X-Session-Id: the conversation (cache affinity).
    session: str | None = None


AcceptHeader = Annotated[str | None, Header(
    alias="Accept", description="text/event-stream: the stream's events carry their id")]


def wants_event_stream(accept: str | None) -> bool:
    return accept is not None and "text/event-stream" in accept.lower()


def route_headers(x_priority: PriorityHeader = None, x_deadline_s: DeadlineHeader = None,
                  x_timeout_s: TimeoutHeader = None, x_inferq_tenant: TenantHeader = None,
                  x_request_id: RequestIdHeader = None, accept: AcceptHeader = None,
                  x_inferq_ttft_slo_ms: SloHeader = None,
                  x_session_id: SessionHeader = None) -> Headers:
    """Both routes' headers, read once (a dependency: the schema lists each header)."""
    return Headers(x_priority, x_deadline_s, x_timeout_s, x_request_id,
                   wants_event_stream(accept), x_inferq_tenant, x_inferq_ttft_slo_ms,
                   x_session_id)


RouteHeaders = Annotated[Headers, Depends(route_headers)]


async def respond(state: GatewayState, caller: Principal,
                  body: ChatCompletionRequest | CompletionRequest, headers: Headers,
                  answer: Callable[[str, int, str, Result],
                                   CompletionResponse | ChatCompletionResponse]) -> Response:
    """Both routes: queue the request, then stream its chunks, or wait and ``answer`` with the
    response body made of the result. A stream takes its place under the caps before the
    request is queued (a 429 leaves nothing queued). ``answer`` is the endpoint's response
    builder (``inferq.openai.responses``)."""
    timeout = state.timeout(headers.timeout_s, "X-Timeout-S")
    stored_id = new_request_id(caller, headers.request_id)
    reservation = await reserve(
        state.client.redis, caller, [stored_id] if stored_id is not None else [],
        text_bytes=text_bytes(body), timeout_s=timeout, namespace=state.settings.namespace,
        max_tokens=body.params().get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    slot = state.stream_slots.take(caller.tenant) if body.stream else None
    try:
        handle = await enqueue(state, caller, body, headers.priority, headers.deadline_s,
                               stored_id, headers.tenant, headers.ttft_slo_ms, headers.session)
    except BaseException:
        if slot is not None:
            slot.release()
        await reservation.release()
        raise
    public = caller.public_id(handle.id)
    chat = isinstance(body, ChatCompletionRequest)
    chunks = Chunks(chat=chat, id=response_id(chat, public), model=body.model,
                    created=int(time.time()))
    echo = {"X-Inferq-Request-Id": public, **reservation.headers}
    if headers.request_id is not None:
        echo["X-Request-Id"] = public
    if slot is not None:
        return stream_response(state, handle, chunks, timeout, body.include_usage, slot,
                               cancel_on_close=not body.resumable, headers=echo,
                               ids=body.resumable or headers.event_stream,
                               reservation=reservation)
    try:
        result = await wait(state, caller, handle, timeout)
    finally:
        await settle_from(handle, reservation)
    body_out = answer(chunks.id, chunks.created, body.model, result)
    return Response(body_out.model_dump_json(), media_type="application/json", headers=echo)


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAM_RESPONSES,
             summary="Create a text completion (OpenAI-compatible)")
async def create_completion(body: CompletionRequest, state: State, caller: Caller,
                            headers: RouteHeaders) -> Response:
    """Continues ``prompt`` (task ``generate``); ``usage`` is the worker tokenizer's count."""
    return await respond(state, caller, body, headers, completion_response)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses=STREAM_RESPONSES, summary="Create a chat completion (OpenAI-compatible)")
async def create_chat_completion(body: ChatCompletionRequest, state: State, caller: Caller,
                                 headers: RouteHeaders) -> Response:
    """Answers ``messages`` (rendered with the model's chat template on the worker)."""
    return await respond(state, caller, body, headers, chat_response)


@router.get("/v1/requests/{request_id}/stream", responses=STREAM_RESPONSES,
            summary="Resume a generation's event stream (Last-Event-ID)")
async def resume_stream(request_id: RequestIdPath, state: State, caller: Caller,
                        model: ModelQuery,
                        format: Annotated[Literal["chat", "completion"], Query(
                            description="the chunks' shape: chat.completion.chunk or "
                                        "text_completion")] = "chat",
                        include_usage: Annotated[bool, Query(
                            description="end with a usage chunk")] = False,
                        last_event_id: Annotated[str | None, Header(
                            alias="Last-Event-ID", description="the id of the last event "
                            "received: the stream goes on after it")] = None,
                        x_timeout_s: TimeoutHeader = None) -> Response:
    """The server-sent events of a ``generate`` request (queued by ``/v1/completions`` or
    ``/v1/chat/completions`` with ``stream``, or any other way), from the start or after
    ``Last-Event-ID``: a client whose stream broke, or whose gateway died, gets the rest from
    any gateway, with no event twice. Reading never cancels the request."""
    position = Position.parse(last_event_id)
    timeout = state.timeout(x_timeout_s, "X-Timeout-S")
    handle = await state.client.find(caller.stored_id(request_id), model=model,
                                     task=GENERATE_TASK)
    if await handle.status() is RequestState.UNKNOWN:
        raise not_found(caller, handle)
    position.check(await state.streams.last_entry(handle.keys, handle.id), last_event_id)
    chat = format == "chat"
    chunks = Chunks(chat=chat, id=response_id(chat, request_id), model=model,
                    created=int(time.time()))
    return stream_response(state, handle, chunks, timeout, include_usage,
                           state.stream_slots.take(caller.tenant), cancel_on_close=False,
                           position=position, headers={"X-Inferq-Request-Id": request_id})
