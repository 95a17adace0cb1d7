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

import json
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse
from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from inferq.errors import InferqError, RequestError, ResultTimeout
from inferq.gateway.caller import Caller, check_priority, new_request_id, tenant_of
from inferq.gateway.errors import ApiError, from_inferq, unavailable
from inferq.gateway.limiting import Reservation, reserve, settle_from
from inferq.gateway.routes.common import (
    DeadlineHeader,
    PriorityHeader,
    RequestIdHeader,
    TenantHeader,
    TimeoutHeader,
)
from inferq.gateway.routes.native import (
    DEFAULT_MAX_NEW_TOKENS,
    ModelQuery,
    RequestIdPath,
    not_found,
    wait_for,
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
from inferq.gateway.streams import Slot, entry_key
from inferq.gateway.tracecontext import trace_fields
from inferq.producer.aio import AsyncHandle
from inferq.producer.common import RequestState, raise_for_status
from inferq.producer.streaming import StreamEntry, StreamReader
from inferq.protocol.codec import Result
from inferq.protocol.generation import GENERATE_TASK, FinishReason
from inferq.tenancy.principal import Principal

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


async def enqueue(state: GatewayState, caller: Principal,
                  body: ChatCompletionRequest | CompletionRequest,
                  priority: int | None, deadline_s: float | None,
                  stored_id: str | None = None, tenant: str | None = None) -> AsyncHandle:
    """Queues the call's request under ``stored_id`` (``new_request_id``)."""
    if isinstance(body, ChatCompletionRequest):
        prompt = ""
        messages: list[Mapping[str, str]] | None = [m.model_dump() for m in body.messages]
    else:
        prompt, messages = body.prompt, None
    chosen = check_priority(caller, body.priority if body.priority is not None else (
        priority if priority is not None else caller.default_priority))
    await state.require_served(GENERATE_TASK, body.model)
    return await state.client.enqueue(
        prompt, messages=messages, model=body.model, task=GENERATE_TASK, priority=chosen,
        deadline_s=body.deadline_s if body.deadline_s is not None else deadline_s,
        params=body.params(), id=stored_id,
        tenant=tenant_of(caller, state.tenant(body.user, tenant)), **trace_fields())


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


def chat_logprobs(output: Any) -> dict[str, Any] | None:
    """The worker's per-token log-probabilities in the chat completion's shape."""
    entries = output.get("logprobs") if isinstance(output, dict) else None
    if not isinstance(entries, list):
        return None

    def item(e: Mapping[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"],
                "bytes": list(str(e["token"]).encode("utf-8"))}

    return {"content": [{**item(e), "top_logprobs": [item(t) for t in e["top"]]}
                        for e in entries], "refusal": None}


def completion_logprobs(output: Any) -> dict[str, Any] | None:
    """The worker's per-token log-probabilities in the (legacy) completion's shape."""
    entries = output.get("logprobs") if isinstance(output, dict) else None
    if not isinstance(entries, list):
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top"]} for e in entries],
            "text_offset": offsets}


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


def event(data: Mapping[str, Any] | str, event_id: str | None = None) -> str:
    """One server-sent event: ``data:``, after its ``id:`` if given."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                         separators=(",", ":"))
    return f"data: {text}\n\n" if event_id is None else f"id: {event_id}\ndata: {text}\n\n"


#: The tail of a stream after its last entry: the finish chunk, the usage chunk, ``[DONE]``.
TAIL = ("f", "u", "d")
START = "0-0"
LAST_EVENT_ID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})(?::([fud]))?$")
#: Both halves of a stream entry id are unsigned 64-bit numbers (XREAD refuses others).
ENTRY_ID_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Position:
    """Where a stream resumes: after entry ``entry``, and after tail event ``tail`` if any."""

    entry: str = START
    tail: str | None = None
    #: Whether the client saw anything (the chat's role chunk is not sent again).
    resumed: bool = False

    @classmethod
    def parse(cls, last_event_id: str | None) -> Position:
        if last_event_id is None:
            return cls()
        match = LAST_EVENT_ID_RE.match(last_event_id.strip())
        if match is None or max(int(match[1]), int(match[2])) > ENTRY_ID_MAX:
            raise ApiError(422, "invalid_request_error", "invalid_request",
                           f"Last-Event-ID: {last_event_id!r} is not an event id of this "
                           "stream (<ms>-<seq>, each below 2^64, optionally :f, :u or :d)",
                           param="Last-Event-ID")
        # Canonical (no leading zeros): compared with the stream's own ids.
        return cls(f"{int(match[1])}-{int(match[2])}", match[3], resumed=True)

    def check(self, last_entry: str | None, raw: str | None) -> None:
        """416 unless the stream could have sent this position: an entry id at or before its
        last entry (``0-0``: nothing yet), and a tail event (``:f``/``:u``/``:d``) only after
        its last entry. Past the end nothing can be resumed: an empty 200 that waits out its
        timeout would hide the client's bug."""
        if not self.resumed:
            return
        last = entry_key(last_entry) if last_entry is not None else (0, 0)
        at = entry_key(self.entry)
        if at > last or (self.tail is not None and at != last):
            where = f"its last entry is {last_entry}" if last_entry else "it has no entry yet"
            raise ApiError(416, "invalid_request_error", "last_event_id_out_of_range",
                           f"Last-Event-ID: {raw!r} is not a position this stream has sent "
                           f"({where}{'' if self.tail is None else ', and :f/:u/:d follow it'}); "
                           "resume with the id of the last event received, or none to "
                           "read from the start", param="Last-Event-ID")


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
                    include_usage: bool, slot: Slot, *, cancel_on_close: bool = True,
                    reservation: Reservation | None = None,
                    position: Position = Position(), headers: Mapping[str, str] = {},
                    ids: bool = True) -> EventStream:
    """The events of ``handle``'s generation after ``position``, each with its ``id:`` when
    ``ids``, read through the gateway's stream reader (``state.streams``: no connection of
    the shared pool is held while waiting). With ``cancel_on_close``, a stream that ends
    before the result (client gone, timeout) cancels the request. ``slot`` (the stream's
    place under the caps) is given back when the stream ends, however it ends."""
    finished = False

    def sse(data: Mapping[str, Any] | str, event_id: str) -> str:
        return event(data, event_id if ids else None)

    async def events() -> AsyncGenerator[str, None]:
        nonlocal finished
        # The chat's role-only chunk goes out with the first thing the worker produced, as
        # vLLM's server sends it: clients time the first token by the first chunk.
        role = chunks.chat and not position.resumed
        reader = StreamReader(position.entry)
        try:
            async for item in state.streams.follow(handle.keys, handle.id, timeout,
                                                   after=position.entry, reader=reader):
                if role:
                    role = False
                    yield sse(chunks.chunk(role="assistant", text=""), START)
                if isinstance(item, StreamEntry):
                    yield sse(chunks.chunk(text=item.text), item.id)
                    continue
                finished = True
                result = raise_for_status(item)
                done = TAIL.index(position.tail) + 1 if position.tail is not None else 0
                last = reader.last_id
                if done <= 0:
                    yield sse(chunks.chunk(text="" if not chunks.chat else None,
                                           finish=finish_reason(result)), f"{last}:f")
                if done <= 1 and include_usage:
                    yield sse(chunks.usage(result), f"{last}:u")
                if done <= 2:
                    yield sse("[DONE]", f"{last}:d")
        except InferqError as exc:
            error = from_inferq(exc, retry_after_s=state.settings.retry_after_s)
            error.request_id = error.request_id or handle.id
            yield event(error.body())
        except RedisError as exc:  # after the 200 went out: an error event, not a traceback
            error = unavailable(exc)
            error.request_id = handle.id
            yield event(error.body())

    async def on_close() -> None:
        slot.release()
        # Client gone, timed out, or failed to read: nobody will read it.
        if not finished and cancel_on_close and not handle.duplicate:
            await cancel_quietly([handle])
        if reservation is not None:
            await settle_from(handle, reservation)

    return EventStream(events(), on_close,
                       headers={"X-Inferq-Request-Id": handle.id, **headers})


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


AcceptHeader = Annotated[str | None, Header(
    alias="Accept", description="text/event-stream: the stream's events carry their id")]


def wants_event_stream(accept: str | None) -> bool:
    return accept is not None and "text/event-stream" in accept.lower()


def route_headers(x_priority: PriorityHeader = None, x_deadline_s: DeadlineHeader = None,
                  x_timeout_s: TimeoutHeader = None, x_inferq_tenant: TenantHeader = None,
                  x_request_id: RequestIdHeader = None, accept: AcceptHeader = None) -> Headers:
    """Both routes' headers, read once (a dependency: the schema lists each header)."""
    return Headers(x_priority, x_deadline_s, x_timeout_s, x_request_id,
                   wants_event_stream(accept), x_inferq_tenant)


RouteHeaders = Annotated[Headers, Depends(route_headers)]


def text_bytes(body: ChatCompletionRequest | CompletionRequest) -> int:
    """The size of a call's input, for its token estimate and byte budget."""
    if isinstance(body, ChatCompletionRequest):
        return sum(len(m.content.encode("utf-8")) for m in body.messages)
    return len(body.prompt.encode("utf-8"))


def chunk_id(chat: bool, request_id: str) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"


async def respond(state: GatewayState, caller: Principal,
                  body: ChatCompletionRequest | CompletionRequest, headers: Headers,
                  answer: Callable[[Chunks, Result], CompletionResponse | ChatCompletionResponse]
                  ) -> Response:
    """Both routes: queue the request, then stream its chunks, or wait and ``answer`` with the
    response body made of the result. A stream takes its place under the caps before the
    request is queued (a 429 leaves nothing queued)."""
    timeout = state.timeout(headers.timeout_s, "X-Timeout-S")
    stored_id = new_request_id(caller, headers.request_id)
    reservation = await reserve(
        state.client.redis, caller, [stored_id] if stored_id is not None else [],
        text_bytes=text_bytes(body), timeout_s=timeout, namespace=state.settings.namespace,
        max_tokens=body.params().get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    slot = state.stream_slots.take(caller.tenant) if body.stream else None
    try:
        handle = await enqueue(state, caller, body, headers.priority, headers.deadline_s,
                               stored_id, headers.tenant)
    except BaseException:
        if slot is not None:
            slot.release()
        await reservation.release()
        raise
    public = caller.public_id(handle.id)
    chat = isinstance(body, ChatCompletionRequest)
    chunks = Chunks(chat=chat, id=chunk_id(chat, public), model=body.model,
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
    return Response(answer(chunks, result).model_dump_json(), media_type="application/json",
                    headers=echo)


@router.post("/v1/completions", response_model=CompletionResponse, responses=STREAM_RESPONSES,
             summary="Create a text completion (OpenAI-compatible)")
async def create_completion(body: CompletionRequest, state: State, caller: Caller,
                            headers: RouteHeaders) -> Response:
    """Continues ``prompt`` (task ``generate``); ``usage`` is the worker tokenizer's count."""
    return await respond(state, caller, body, headers, lambda chunks, result: CompletionResponse(
        id=chunks.id, created=chunks.created, model=body.model, usage=usage_of(result),
        choices=[CompletionChoice(text=text_of(result, body.model),
                                  finish_reason=finish_reason(result),
                                  logprobs=completion_logprobs(result.output))]))


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses=STREAM_RESPONSES, summary="Create a chat completion (OpenAI-compatible)")
async def create_chat_completion(body: ChatCompletionRequest, state: State, caller: Caller,
                                 headers: RouteHeaders) -> Response:
    """Answers ``messages`` (rendered with the model's chat template on the worker)."""
    def answer(chunks: Chunks, result: Result) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=chunks.id, created=chunks.created, model=body.model, usage=usage_of(result),
            choices=[ChatChoice(message=AssistantMessage(content=text_of(result, body.model)),
                                finish_reason=finish_reason(result),
                                logprobs=chat_logprobs(result.output))])

    return await respond(state, caller, body, headers, answer)


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
    chunks = Chunks(chat=chat, id=chunk_id(chat, request_id), model=model,
                    created=int(time.time()))
    return stream_response(state, handle, chunks, timeout, include_usage,
                           state.stream_slots.take(caller.tenant), cancel_on_close=False,
                           position=position, headers={"X-Inferq-Request-Id": request_id})
