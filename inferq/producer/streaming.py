"""Reading a generation's token stream: the part the sync and async handles share.

A generating worker appends each decode step's new text to the request's Redis Stream
(``inferq:{Q}:stream:<id>``: entries ``a`` attempt, ``d`` text delta; ``e`` marks the end) and
finally writes the result. A reader follows the stream with ``XREAD BLOCK`` from the start, so
a client that reconnects reads everything again; it stops at the end marker, or when a read
times out and the result exists (a request cancelled before it ran, or finished by a worker
that does not stream, has no end marker to wait for).

If a worker dies mid-generation and the request runs again (a new attempt), the new attempt's
stream restarts from its first token. Generation is replayable (greedy, or seeded sampling; the
worker derives a seed from the request id when none is given), so the reader skips the part of
the new attempt's text it already yielded and carries on where it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: How long one XREAD blocks before the reader checks for a result (a cancellation before the
#: request ran leaves no end marker in the stream).
BLOCK_MS = 250
READ_COUNT = 512


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class StreamReader:
    """Turns XREAD replies into the text deltas to yield; tracks position and attempts."""

    def __init__(self) -> None:
        self.last_id = "0-0"
        self.ended = False
        self._attempt = 0
        self._yielded = 0  # characters yielded so far, over all attempts
        self._attempt_chars = 0  # characters seen in the current attempt's entries

    def feed(self, reply: Any) -> list[str]:
        """Deltas to yield from one ``XREAD`` reply (RESP2 list or RESP3 mapping)."""
        out: list[str] = []
        for entry_id, fields in _entries(reply):
            self.last_id = entry_id
            if "e" in fields:
                self.ended = True
                continue
            attempt = int(fields.get("a", "1") or 1)
            if attempt != self._attempt:
                self._attempt, self._attempt_chars = attempt, 0
            delta = fields.get("d", "")
            start = self._attempt_chars
            self._attempt_chars += len(delta)
            # Text a previous attempt already produced was yielded once; skip it.
            fresh = delta[max(0, self._yielded - start):]
            if fresh:
                out.append(fresh)
                self._yielded += len(fresh)
        return out


def _entries(reply: Any) -> Iterable[tuple[str, dict[str, str]]]:
    if not reply:
        return []
    streams: Iterable[Any] = reply.values() if isinstance(reply, dict) else (
        stream_rows for _key, stream_rows in reply)
    rows = [row for stream_rows in streams for row in stream_rows]
    out = []
    for entry_id, fields in rows:
        if isinstance(fields, dict):
            decoded = {_s(k): _s(v) for k, v in fields.items()}
        else:
            decoded = {_s(fields[i]): _s(fields[i + 1]) for i in range(0, len(fields), 2)}
        out.append((_s(entry_id), decoded))
    return out
