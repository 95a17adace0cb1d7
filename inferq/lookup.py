"""One request found by its id alone: ``inferq request ID`` and ``Client.lookup``.

An id does not name its queue, so the lookup asks every known queue (the registries that
``inferq stats`` reads), each of its shards in one pipelined round trip: the request hash's
bookkeeping (``RequestInfo.FIELDS``), the stored result, and whether it is dead-lettered.
The first queue that knows the id answers. Times are Redis-clock milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from inferq.deadletters import parse_record
from inferq.plans import Plan, call
from inferq.producer.info import RequestInfo, as_info
from inferq.producer.options import ClientOptions
from inferq.producer.replies import RequestState
from inferq.protocol.codec import decode_payload_fields
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys
from inferq.stats import shard_keys
from inferq.tracing import trace_id_of

#: Characters of the result's output shown by ``head``.
HEAD_CHARS = 200


@dataclass(frozen=True, slots=True)
class Lookup:
    queue: str
    shard: int
    info: RequestInfo
    #: When it was dead-lettered (ms, Redis clock), if it is in the dead set.
    dead_ms: int | None
    #: Redis's clock when it was read (ms).
    now_ms: int
    #: The dead letter's error (code, message), kept after its result expired.
    dead_error: tuple[str, str] | None = None
    #: The trace its spans belong to (docs/guides/tracing.md): from its result, else from the
    #: payload of a request still waiting or running.
    trace_id: str | None = None

    @property
    def error(self) -> tuple[str, str] | None:
        """(code, message) of its error: from its result, else from its dead letter."""
        result = self.info.result
        if result is not None and result.error is not None:
            return result.error.code, result.error.message
        return self.dead_error

    def head(self, chars: int = HEAD_CHARS) -> str | None:
        """The start of its result's output (text, or the shape of an embedding)."""
        result = self.info.result
        if result is None or result.output is None:
            return None
        output: Any = result.output
        text: str
        if isinstance(output, dict) and isinstance(output.get("text"), str):
            text = str(output["text"])
        elif isinstance(output, dict) and isinstance(output.get("embedding"), list):
            vector = output["embedding"]
            text = f"embedding[{len(vector)}] " + ", ".join(f"{x:.4f}" for x in vector[:4])
        else:
            text = repr(output)
        return text if len(text) <= chars else text[: chars - 1] + "…"

    def as_dict(self) -> dict[str, Any]:
        info = self.info
        return {
            "id": info.id, "queue": self.queue, "shard": self.shard, "state": info.state.value,
            "attempts": info.attempts, "max_attempts": info.max_attempts, "owner": info.owner,
            "enqueued_ms": info.enqueued_ms, "claimed_ms": info.claimed_ms,
            "deadline_ms": info.deadline_ms, "finished_ms": info.finished_ms,
            "now_ms": self.now_ms, "dead_lettered_ms": self.dead_ms,
            "error": (None if self.error is None
                      else {"code": self.error[0], "message": self.error[1]}),
            "result_head": self.head(), "trace_id": self.trace_id,
            "ttft_ms": info.result.ttft_ms if info.result is not None else None,
        }


def trace_of(info: RequestInfo, payload: bytes | None) -> str | None:
    """The trace id in its result, else in its payload (a damaged one has none)."""
    if info.result is not None and info.result.trace_id is not None:
        return info.result.trace_id
    if payload is None:
        return None
    try:
        traceparent = decode_payload_fields(bytes(payload)).get("traceparent")
    except Exception:  # a damaged payload: no trace to show, the rest still is
        return None
    return trace_id_of(traceparent) if isinstance(traceparent, str) else None


def find(request_id: str, queues: list[QueueKeys], options: ClientOptions) -> Plan[Lookup | None]:
    """The first of ``queues`` (every shard) that knows ``request_id``, or None."""
    (now,) = yield [call("execute_command", "TIME")]
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    for queue in queues:
        shards = yield from shard_keys(queue)
        for keys in shards:
            values, raw, dead, record, payload = yield [
                call("hmget", keys.request(request_id), *RequestInfo.FIELDS),
                call("lindex", keys.result(request_id), 0),
                call("zscore", keys.dead, request_id),
                call("hget", keys.dead_letters, request_id),
                call("hget", keys.request(request_id), Field.PAYLOAD)]
            if raw is None and dead is None and all(v is None for v in values):
                continue
            info = as_info(request_id, [values, raw], options)
            dead_error = None
            if dead is not None:  # its dead-letter record knows what an expired result knew
                letter = parse_record(keys, request_id, int(dead), record)
                info = replace(info, enqueued_ms=info.enqueued_ms or letter.enqueued_ms,
                               max_attempts=info.max_attempts or letter.max_attempts,
                               attempts=info.attempts or letter.attempts,
                               state=(RequestState.DEAD if info.state is RequestState.UNKNOWN
                                      else info.state))
                if letter.error_code:
                    dead_error = (letter.error_code, letter.error_message)
            return Lookup(keys.queue, keys.shard, info,
                          None if dead is None else int(dead), now_ms, dead_error,
                          trace_of(info, payload))
    return None
