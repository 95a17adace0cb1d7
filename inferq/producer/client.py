"""Synchronous producer client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import redis

from inferq import connection
from inferq.connection import ConnectionSettings
from inferq.errors import ResultTimeout
from inferq.producer import common
from inferq.producer.common import BLOCKING_DEFAULTS, ClientOptions, RequestState
from inferq.producer.streaming import BLOCK_MS, READ_COUNT, StreamReader
from inferq.protocol import ops
from inferq.protocol.codec import Result
from inferq.protocol.keys import QueueKeys


class Handle:
    """A queued request. Cheap to create from an id with ``Client.handle``."""

    def __init__(self, client: Client, keys: QueueKeys, request_id: str, outcome: str) -> None:
        self._client = client
        self.keys = keys
        self.id = request_id
        #: What enqueue found: ``queued``, or ``pending``/``inflight``/``done`` for a repeated id.
        self.outcome = outcome

    @property
    def duplicate(self) -> bool:
        return self.outcome != "queued"

    def result(self, timeout: float | None = None) -> Result:
        """Block on Redis (no polling) until the result exists; return it or raise its error.

        ``timeout`` None waits forever. Raises ``ResultTimeout``, ``RequestFailed``,
        ``RequestCancelled`` or ``DeadlineExceeded``.
        """
        key = self.keys.result(self.id)
        raw = self._client.redis.blmove(key, key, common.block_timeout(timeout),
                                        "LEFT", "LEFT")
        result = common.parse_result(raw, self._client.options)
        if result is None:
            raise ResultTimeout(f"no result for request {self.id} within {timeout} s")
        return common.raise_for_status(result)

    def peek(self) -> Result | None:
        """The stored result if there is one, without waiting or raising."""
        raw = self._client.redis.lindex(self.keys.result(self.id), 0)
        return common.parse_result(raw, self._client.options)

    def stream(self, timeout: float | None = None) -> Iterator[str | Result]:
        """Follow a ``generate`` request: yield its text deltas as the worker produces them,
        then its final ``Result`` (whatever its status: ok, cancelled, failed, ...), and stop.

        Reads the request's stream from the start, so calling it again (or from another
        process) replays the whole text. ``timeout`` bounds the whole iteration
        (``ResultTimeout``). A request served by a worker that does not stream yields no
        deltas, only its result (whose ``output["text"]`` holds the text).
        """
        redis_ = self._client.redis
        key, result_key = self.keys.stream(self.id), self.keys.result(self.id)
        deadline = None if timeout is None else time.monotonic() + common.block_timeout(timeout)
        reader = StreamReader()
        while True:
            block = BLOCK_MS
            if deadline is not None:
                block = max(1, min(block, int((deadline - time.monotonic()) * 1e3)))
            reply = redis_.xread({key: reader.last_id}, count=READ_COUNT, block=block)
            yield from reader.feed(reply)
            if reader.ended or not reply:
                raw = redis_.lindex(result_key, 0)
                if raw is not None:
                    # Deltas are written before the result: take any not read yet.
                    yield from reader.feed(redis_.xread({key: reader.last_id}, count=1 << 16))
                    result = common.parse_result(raw, self._client.options)
                    assert result is not None
                    yield result
                    return
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"no result for request {self.id} within {timeout} s")

    def status(self) -> RequestState:
        pipe = self._client.redis.pipeline(transaction=False)
        pipe.hget(self.keys.request(self.id), "st")
        pipe.lindex(self.keys.result(self.id), 0)
        state, raw = pipe.execute()
        return common.state_of(state, raw, self._client.options)

    def cancel(self) -> bool:
        """Cancel if not finished. True when this call cancelled it."""
        keys, args = ops.cancel_call(self.keys, self.id,
                                     int(self._client.options.result_ttl_s * 1000))
        outcome = self._client.scripts["cancel"](keys=keys, args=args)
        return bool(outcome in (b"cancelled", "cancelled"))

    def __repr__(self) -> str:
        return f"Handle(id={self.id!r}, queue={self.keys.queue!r}, outcome={self.outcome!r})"


class Client:
    """``Client(url).enqueue("text", model="minilm")`` then ``handle.result(timeout=30)``."""

    def __init__(self, url: str | ConnectionSettings | None = None, *,
                 options: ClientOptions | None = None, **redis_kwargs: Any) -> None:
        """``url`` is a URL (default ``$INFERQ_REDIS_URL``; TLS files from ``$INFERQ_TLS_*``)
        or a ``ConnectionSettings``; ``redis_kwargs`` go to redis-py and win over both."""
        self.connection = connection.resolve(url)
        self.url = self.connection.url
        self.options = options or ClientOptions()
        self.redis: redis.Redis = connection.sync_client(
            self.connection, **{**BLOCKING_DEFAULTS, **redis_kwargs})
        self.scripts = ops.register(self.redis)

    def enqueue(
        self,
        prompt: str = "",
        *,
        model: str,
        task: str = "embed",
        priority: int = 0,
        deadline_s: float | None = None,
        id: str | None = None,
        params: Mapping[str, Any] | None = None,
        max_attempts: int = 3,
        messages: Sequence[Mapping[str, str]] | None = None,
    ) -> Handle:
        """Queue one request. For ``task="generate"``, ``params`` takes ``max_new_tokens``,
        ``temperature``, ``top_p``, ``top_k``, ``seed`` and ``stop``, and ``messages`` (a list
        of ``{"role", "content"}``, with an empty prompt) asks for the model's chat template."""
        p = common.prepare(prompt, model=model, task=task, priority=priority,
                           deadline_s=deadline_s, id=id, params=params,
                           max_attempts=max_attempts, options=self.options, messages=messages)
        keys, args = ops.enqueue_call(p.keys, [p.item])
        reply = ops.parse_enqueue(self.scripts["enqueue"](keys=keys, args=args))
        common.check_full(reply, p, self.options)
        return Handle(self, p.keys, p.item.id, reply.outcomes[0])

    def enqueue_many(self, requests: Iterable[str | Mapping[str, Any]],
                     **defaults: Any) -> list[Handle]:
        """Enqueue many requests in one round trip (one script call per queue, pipelined).

        Each request is a prompt or a mapping of ``enqueue`` keyword arguments; ``defaults``
        (e.g. ``model=``) apply to all. Raises ``QueueFull`` if any was refused; its
        ``accepted`` attribute lists the handles that did get in.
        """
        prepared = common.prepare_many(requests, defaults, self.options)
        groups = common.group_by_queue(prepared)
        pipe = self.redis.pipeline(transaction=False)
        for keys, indices in groups.items():
            call_keys, args = ops.enqueue_call(keys, [prepared[i].item for i in indices])
            self.scripts["enqueue"](keys=call_keys, args=args, client=pipe)
        replies = pipe.execute()
        return common.collect_handles(
            prepared, groups, replies, self.options,
            lambda keys, request_id, outcome: Handle(self, keys, request_id, outcome),
        )

    def handle(self, request_id: str, *, model: str, task: str = "embed") -> Handle:
        """A handle for a request enqueued elsewhere (another process, an earlier run)."""
        return Handle(self, QueueKeys.for_model(task, model, self.options.namespace),
                      request_id, "unknown")

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

