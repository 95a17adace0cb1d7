"""Synchronous producer client."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from operator import methodcaller
from types import TracebackType
from typing import Any, Unpack

import redis

from inferq import connection
from inferq.connection import ConnectionSettings, wrap_connection_errors
from inferq.errors import ResultTimeout
from inferq.producer import common
from inferq.producer.common import (
    BLOCKING_DEFAULTS,
    ClientOptions,
    EnqueueOptions,
    RequestState,
)
from inferq.producer.streaming import follow
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
        ``RequestCancelled`` or ``DeadlineExceeded`` (and ``BackendUnavailable``).
        """
        key = self.keys.result(self.id)
        with wrap_connection_errors(self._client.connection):
            raw = self._client.redis.blmove(key, key, common.block_timeout(timeout),
                                            "LEFT", "LEFT")
        result = common.parse_result(raw, self._client.options)
        if result is None:
            raise ResultTimeout(f"no result for request {self.id} within {timeout} s")
        return common.raise_for_status(result)

    def peek(self) -> Result | None:
        """The stored result if there is one, without waiting or raising."""
        with wrap_connection_errors(self._client.connection):
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
        steps = follow(self.keys, self.id, timeout, self._client.options)
        with wrap_connection_errors(self._client.connection):
            for step in steps:
                while isinstance(step, methodcaller):  # a read: send its reply back
                    step = steps.send(step(self._client.redis))
                yield step

    def status(self) -> RequestState:
        pipe = self._client.redis.pipeline(transaction=False)
        pipe.hget(self.keys.request(self.id), "st")
        pipe.lindex(self.keys.result(self.id), 0)
        with wrap_connection_errors(self._client.connection):
            state, raw = pipe.execute()
        return common.state_of(state, raw, self._client.options)

    def cancel(self) -> bool:
        """Cancel if not finished. True when this call cancelled it."""
        keys, args = ops.cancel_call(self.keys, self.id,
                                     int(self._client.options.result_ttl_s * 1000))
        with wrap_connection_errors(self._client.connection):
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

    def enqueue(self, prompt: str = "", **request: Unpack[EnqueueOptions]) -> Handle:
        """Queue one request and return its ``Handle``. Keyword arguments (``EnqueueOptions``):

        * ``model`` (required), ``task`` (``"embed"``, ``"generate"``, ``"score"``): the queue;
        * ``priority``: in [-100, 100], default 0; higher is served first, FIFO within one;
        * ``deadline_s``: still queued when it passes, the request is answered ``expired``;
        * ``id``: idempotency key (default random): an existing id returns that request;
        * ``params``: task parameters; ``generate`` takes ``max_new_tokens``,
          ``temperature``, ``top_p``, ``top_k``, ``seed`` and ``stop``;
        * ``max_attempts``: runs allowed (default 3); a run counts when a worker starts it,
          not when it claims it; after the last failed or lost run it is dead-lettered;
        * ``messages``: ``generate`` chat input, ``[{"role", "content"}]`` (empty prompt).

        Raises ``ValidationError``, ``QueueFull`` or ``BackendUnavailable``."""
        p = common.prepare(prompt, request, self.options)
        keys, args = ops.enqueue_call(p.keys, [p.item])
        with wrap_connection_errors(self.connection):
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
        with wrap_connection_errors(self.connection):
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

