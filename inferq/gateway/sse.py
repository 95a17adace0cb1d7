"""Server-sent events of a generation: the chunks of one stream (``Chunks``), the events
and their ids (``event``, ``Position``: where a resumed stream goes on), and the streaming
response that reads them through the gateway's stream reader (``stream_response``). Used by
``routes.completions``; the ids are described there."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from inferq.errors import InferqError
from inferq.gateway.coalesce import cancel_quietly
from inferq.gateway.limiting import Reservation, settle_from
from inferq.gateway.state import GatewayState
from inferq.gateway.streams import Slot, Started, entry_key
from inferq.openai.errors import ApiError, from_inferq, unavailable
from inferq.openai.responses import finish_reason, usage_of
from inferq.producer.aio import AsyncHandle
from inferq.producer.replies import raise_for_status
from inferq.producer.streaming import StreamEntry, StreamReader
from inferq.protocol.codec import Result


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
        # The chat's role-only chunk goes out with the first token the worker produced (its
        # first stream entry, even one whose text is held back or empty), as vLLM's server
        # sends it with its first output: clients time the first token by the first chunk.
        role = chunks.chat and not position.resumed
        reader = StreamReader(position.entry)
        try:
            async for item in state.streams.follow(handle.keys, handle.id, timeout,
                                                   after=position.entry, reader=reader,
                                                   announce_start=role):
                if role:
                    role = False
                    yield sse(chunks.chunk(role="assistant", text=""), START)
                if isinstance(item, Started):
                    continue
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
