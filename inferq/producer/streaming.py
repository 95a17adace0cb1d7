"""Reading a generation's token stream: the part the sync and async handles share.

A generating worker appends each decode step's new text to the request's Redis Stream
(``inferq:{Q}:stream:<id>``, entries of ``fields.StreamField``: the attempt, the text delta,
the token ids behind it; or the end marker) and finally writes the result. A reader follows
the stream with ``XREAD BLOCK`` from the start, so a client that reconnects reads everything
again; it stops at the end marker, or when a read times out and the result exists (a request
cancelled before it ran, or finished by a worker that does not stream, has no end marker to
wait for).

If a worker dies mid-generation and the request runs again (a new attempt), the new attempt
goes on from the tokens already in the stream (the worker reads them back and prefills prompt +
those tokens), so the stream is append-only text that never contradicts itself, whatever the
numerics or sampling of the new attempt: the reader yields every delta as it is.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable
from operator import methodcaller
from typing import Any, NamedTuple

from inferq.errors import ResultTimeout
from inferq.producer.options import ClientOptions
from inferq.producer.replies import parse_result
from inferq.producer.waits import block_timeout
from inferq.protocol.codec import Result
from inferq.protocol.fields import StreamField
from inferq.protocol.keys import QueueKeys
from inferq.protocol.ops import as_str

#: How long one XREAD blocks before the reader checks for a result (a cancellation before the
#: request ran leaves no end marker in the stream).
BLOCK_MS = 250
READ_COUNT = 512


class StreamReader:
    """Turns XREAD replies into the text deltas to yield; tracks the position."""

    def __init__(self, after: str = "0-0") -> None:
        self.last_id = after
        self.ended = False

    def feed(self, reply: Any) -> list[str]:
        """Deltas to yield from one ``XREAD`` reply (RESP2 list or RESP3 mapping)."""
        return [text for _id, text in self.feed_entries(reply)]

    def feed_entries(self, reply: Any) -> list[StreamEntry]:
        """``feed`` with each delta's stream entry id."""
        out: list[StreamEntry] = []
        for entry_id, fields in _entries(reply):
            self.last_id = entry_id
            if StreamField.END in fields:
                self.ended = True
            elif delta := fields.get(StreamField.TEXT, ""):
                out.append(StreamEntry(entry_id, delta))
        return out


class StreamEntry(NamedTuple):
    """A text delta and the id of the stream entry that holds it."""

    id: str
    text: str


def follow(keys: QueueKeys, request_id: str, timeout: float | None,
           options: ClientOptions) -> Generator[methodcaller | str | Result, Any, None]:
    """How ``Handle.stream`` and ``AsyncHandle.stream`` read, without I/O: yields either a Redis
    call to make (a ``methodcaller`` on the client, whose reply is sent back) or an item for
    the caller: each text delta, then the final ``Result``."""
    items = follow_entries(keys, request_id, timeout, options)
    reply: Any = None
    while True:
        try:
            item = items.send(reply)
        except StopIteration:
            return
        if isinstance(item, methodcaller):
            reply = yield item
            continue
        reply = None
        yield item.text if isinstance(item, StreamEntry) else item


def follow_entries(keys: QueueKeys, request_id: str, timeout: float | None,
                   options: ClientOptions, after: str = "0-0", reader: StreamReader | None = None
                   ) -> Generator[methodcaller | StreamEntry | Result, Any, None]:
    """``follow`` with each delta's entry id, from the entry after ``after`` (a reader that
    reconnects goes on from the last id it saw). ``reader`` (made here if not given) holds the
    position: after the ``Result``, its ``last_id`` is the stream's last entry."""
    key, result_key = keys.stream(request_id), keys.result(request_id)
    deadline = None if timeout is None else time.monotonic() + block_timeout(timeout)
    reader = reader if reader is not None else StreamReader(after)
    reader.last_id = after
    while True:
        block = BLOCK_MS
        if deadline is not None:
            block = max(1, min(block, int((deadline - time.monotonic()) * 1e3)))
        reply = yield methodcaller("xread", {key: reader.last_id}, count=READ_COUNT, block=block)
        yield from reader.feed_entries(reply)
        if reader.ended or not reply:
            raw = yield methodcaller("lindex", result_key, 0)
            if raw is not None:
                # Deltas are written before the result: take any not read yet.
                yield from reader.feed_entries((yield methodcaller(
                    "xread", {key: reader.last_id}, count=1 << 16)))
                result = parse_result(raw, options)
                assert result is not None
                yield result
                return
        if deadline is not None and time.monotonic() >= deadline:
            raise ResultTimeout(f"no result for request {request_id} within {timeout} s")


def _entries(reply: Any) -> Iterable[tuple[str, dict[str, str]]]:
    if not reply:
        return []
    streams: Iterable[Any] = reply.values() if isinstance(reply, dict) else (
        stream_rows for _key, stream_rows in reply)
    rows = [row for stream_rows in streams for row in stream_rows]
    out = []
    for entry_id, fields in rows:
        if isinstance(fields, dict):
            decoded = {as_str(k): as_str(v) for k, v in fields.items()}
        else:
            decoded = {as_str(fields[i]): as_str(fields[i + 1]) for i in range(0, len(fields), 2)}
        out.append((as_str(entry_id), decoded))
    return out
