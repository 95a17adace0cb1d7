"""OpenAI-compatible text generation: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

Each call queues one ``generate`` request (``prompt``, or chat ``messages`` rendered with the
model's chat template on the worker) and answers with its text, finish reason and token usage,
or with ``stream: true`` relays the worker's text deltas as server-sent events of chunks, ending
with ``data: [DONE]``. A stream whose client goes away, or whose wait times out, cancels its
request, so no worker keeps generating what nobody reads. A request that ends in an error
mid-stream sends one ``data: {"error": {...}}`` event (the OpenAI SDK raises it) and stops.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inferq.errors import InferqError, RequestError, ResultTimeout
from inferq.gateway.errors import ApiError, from_inferq
from inferq.gateway.routes.common import (
    DeadlineHeader,
    PriorityHeader,
    TenantHeader,
    TimeoutHeader,
)
from inferq.gateway.schemas import (
    ERROR_RESPONSES,
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionUsage,
)
from inferq.gateway.state import GatewayState, State, cancel_quietly
from inferq.producer.aio import AsyncHandle
from inferq.producer.common import raise_for_status
from inferq.protocol.codec import Result
from inferq.protocol.generation import GENERATE_TASK, FinishReason

router = APIRouter(tags=["openai"])

STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "JSON, or with stream=true server-sent events of chunks",
          "content": {"text/event-stream": {}}},
    **ERROR_RESPONSES,
}


def finish_reason(result: Result) -> Literal["stop", "length"]:
    return "length" if result.finish_reason is FinishReason.LENGTH else "stop"


def usage_of(result: Result) -> CompletionUsage:
    prompt = result.usage.prompt_tokens if result.usage is not None else 0
    completion = result.usage.completion_tokens if result.usage is not None else 0
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion)


def text_of(result: Result, model: str) -> str:
    output = result.output
    text = output.get("text") if isinstance(output, dict) else None
    if not isinstance(text, str):
        raise ApiError(502, "upstream_error", "invalid_output",
                       f"model {model!r} returned a {type(output).__name__}, not a generation "
                       "(no 'text'): is it a generate worker?", request_id=result.id)
    return text


async def cancel_shielded(handle: AsyncHandle) -> None:
    # Runs while the route is being cancelled (client gone): shielded, or it never would.
    with anyio.CancelScope(shield=True):
        await cancel_quietly([handle])


async def enqueue(state: GatewayState, body: ChatCompletionRequest | CompletionRequest,
                  priority: int | None, deadline_s: float | None,
                  tenant: str | None = None) -> AsyncHandle:
    if isinstance(body, ChatCompletionRequest):
        prompt = ""
        messages: list[Mapping[str, str]] | None = [m.model_dump() for m in body.messages]
    else:
        prompt, messages = body.prompt, None
    await state.require_served(GENERATE_TASK, body.model)
    return await state.client.enqueue(
        prompt, messages=messages, model=body.model, task=GENERATE_TASK,
        priority=body.priority if body.priority is not None else (priority or 0),
        deadline_s=body.deadline_s if body.deadline_s is not None else deadline_s,
        params=body.params(), tenant=state.tenant(body.user, tenant))


async def wait(handle: AsyncHandle, timeout: float) -> Result:
    """The ok result; a timeout (or this call being cancelled) cancels the request."""
    try:
        return await handle.result(timeout)
    except RequestError:
        raise  # finished: nothing to cancel
    except ResultTimeout as exc:
        await cancel_shielded(handle)
        error = from_inferq(exc)
        error.request_id = handle.id
        raise error from exc
    except BaseException:
        await cancel_shielded(handle)
        raise


# --- streaming -----------------------------------------------------------------------------

@dataclass
class Chunks:
    """Builds the chunk objects of one stream (chat or text completion)."""

    chat: bool
    id: str
    model: str
    created: int

    def chunk(self, *, text: str | None = None, role: str | None = None,
              finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {}
            if role is not None:
                delta["role"] = role
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        return {"id": self.id, "created": self.created, "model": self.model,
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "choices": [choice]}

    def usage(self, result: Result) -> dict[str, Any]:
        body = self.chunk()
        body["choices"] = []
        body["usage"] = usage_of(result).model_dump()
        return body


def sse(data: Mapping[str, Any] | str) -> str:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                         separators=(",", ":"))
    return f"data: {text}\n\n"


class EventStream(StreamingResponse):
    """A server-sent event stream that, however it ends (done, client gone, error), closes its
    generator and then runs ``on_close``, shielded from the cancellation that ended it."""

    def __init__(self, events: AsyncGenerator[str, None],
                 on_close: Callable[[], Awaitable[None]], headers: Mapping[str, str]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                  **headers})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                await self._on_close()


def stream_response(state: GatewayState, handle: AsyncHandle, chunks: Chunks, timeout: float,
                    include_usage: bool) -> EventStream:
    finished = False

    async def events() -> AsyncGenerator[str, None]:
        nonlocal finished
        if chunks.chat:
            yield sse(chunks.chunk(role="assistant", text=""))
        try:
            async for item in handle.stream(timeout):
                if isinstance(item, str):
                    yield sse(chunks.chunk(text=item))
                    continue
                finished = True
                result = raise_for_status(item)
                yield sse(chunks.chunk(text="" if not chunks.chat else None,
                                       finish=finish_reason(result)))
                if include_usage:
                    yield sse(chunks.usage(result))
                yield sse("[DONE]")
        except InferqError as exc:
            error = from_inferq(exc, retry_after_s=state.settings.retry_after_s)
            error.request_id = error.request_id or handle.id
            yield sse(error.body())

    async def on_close() -> None:
        if not finished:  # client gone, timed out, or failed to read: nobody will read it
            await cancel_quietly([handle])

    return EventStream(events(), on_close, headers={"X-Inferq-Request-Id": handle.id})


# --- routes --------------------------------------------------------------------------------

async def respond(state: GatewayState, body: ChatCompletionRequest | CompletionRequest,
                  headers: tuple[int | None, float | None, float | None],
                  answer: Callable[[Chunks, Result], CompletionResponse | ChatCompletionResponse],
                  tenant: str | None = None) -> Response:
    """Both routes: queue the request, then stream its chunks, or wait and ``answer`` with the
    response body made of the result. ``headers``: X-Priority, X-Deadline-S, X-Timeout-S;
    ``tenant``: X-Inferq-Tenant."""
    priority, deadline_s, timeout_s = headers
    timeout = state.timeout(timeout_s, "X-Timeout-S")
    handle = await enqueue(state, body, priority, deadline_s, tenant)
    chat = isinstance(body, ChatCompletionRequest)
    chunks = Chunks(chat=chat, id=f"{'chatcmpl' if chat else 'cmpl'}-{handle.id}",
                    model=body.model, created=int(time.time()))
    if body.stream:
        return stream_response(state, handle, chunks, timeout, body.include_usage)
    result = await wait(handle, timeout)
    return Response(answer(chunks, result).model_dump_json(), media_type="application/json",
                    headers={"X-Inferq-Request-Id": handle.id})


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAM_RESPONSES,
             summary="Create a text completion (OpenAI-compatible)")
async def create_completion(body: CompletionRequest, state: State,
                            x_priority: PriorityHeader = None,
                            x_deadline_s: DeadlineHeader = None,
                            x_timeout_s: TimeoutHeader = None,
                            x_inferq_tenant: TenantHeader = None) -> Response:
    """Continues ``prompt`` (task ``generate``); ``usage`` is the worker tokenizer's count."""
    return await respond(state, body, (x_priority, x_deadline_s, x_timeout_s),
                         lambda chunks, result: CompletionResponse(
        id=chunks.id, created=chunks.created, model=body.model, usage=usage_of(result),
        choices=[CompletionChoice(text=text_of(result, body.model),
                                  finish_reason=finish_reason(result))]), x_inferq_tenant)


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses=STREAM_RESPONSES, summary="Create a chat completion (OpenAI-compatible)")
async def create_chat_completion(body: ChatCompletionRequest, state: State,
                                 x_priority: PriorityHeader = None,
                                 x_deadline_s: DeadlineHeader = None,
                                 x_timeout_s: TimeoutHeader = None,
                                 x_inferq_tenant: TenantHeader = None) -> Response:
    """Answers ``messages`` (rendered with the model's chat template on the worker)."""
    return await respond(state, body, (x_priority, x_deadline_s, x_timeout_s),
                         lambda chunks, result: ChatCompletionResponse(
        id=chunks.id, created=chunks.created, model=body.model, usage=usage_of(result),
        choices=[ChatChoice(message=AssistantMessage(content=text_of(result, body.model)),
                            finish_reason=finish_reason(result))]), x_inferq_tenant)
