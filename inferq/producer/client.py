"""Synchronous producer client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import methodcaller
from types import TracebackType
from typing import Any, TypeVar, Unpack

import redis
from redis.sentinel import SentinelConnectionPool

from inferq import connection, plans, stats
from inferq.connection import ConnectionSettings, wrap_connection_errors
from inferq.plans import Plan
from inferq.producer.admin import DeadLetters
from inferq.producer.base import ClientBase
from inferq.producer.handle import HandleBase
from inferq.producer.inbox import SyncResultInbox
from inferq.producer.info import CancelOutcome, RequestInfo
from inferq.producer.options import BLOCKING_DEFAULTS, ClientOptions, EnqueueOptions
from inferq.producer.replies import RequestState, results_in_order
from inferq.producer.streaming import follow
from inferq.protocol import ops
from inferq.protocol.codec import Result
from inferq.protocol.keys import QueueKeys, shard_of
from inferq.protocol.settings import QueueSettings
from inferq.tenancy.apikeys import KeyStore

T = TypeVar("T")


class Handle(HandleBase["Client"]):
    """A queued request. Cheap to create from an id with ``Client.handle``."""

    def result(self, timeout: float | None = None) -> Result:
        """Block on Redis (no polling) until the result exists; return it or raise its error.

        ``timeout`` None waits forever. Raises ``ResultTimeout``, ``RequestFailed``,
        ``RequestCancelled`` or ``DeadlineExceeded`` (and ``BackendUnavailable``).
        """
        if self._via_inbox:
            raw = self._client.inbox(self.keys).wait(self.id, self._checked(timeout))
        else:
            raw = self._run(self._wait(timeout))
        return self._outcome(raw, timeout)

    def peek(self) -> Result | None:
        """The stored result if there is one, without waiting or raising."""
        return self._run(self._peek())

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
        return self._run(self._status())

    def cancel(self) -> CancelOutcome:
        """Cancel if not finished. The outcome is truthy only when this call cancelled it;
        ``DONE`` when it had already finished, ``UNKNOWN`` when there is no such request."""
        return self._run(self._cancel())

    def info(self) -> RequestInfo:
        """State, attempts, owner and timings (one read-only round trip); see ``RequestInfo``."""
        return self._run(self._info())

    def _run(self, plan: Plan[T]) -> T:
        with wrap_connection_errors(self._client.connection):
            return plans.run(self._client.redis, plan)


def blocking_pool_client(client: Any, max_connections: int) -> Any:
    """``client`` (configured by ``connection.sync_client``) on a ``BlockingConnectionPool``
    of ``max_connections`` with the same connection settings: threads beyond that wait for a
    free connection instead of failing with ``MaxConnectionsError``."""
    if not isinstance(client, redis.Redis) or isinstance(
            client.connection_pool, SentinelConnectionPool):
        return client  # a cluster client (a pool per node) or a sentinel's: unbounded
    pool = client.connection_pool
    blocking = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
        connection_class=pool.connection_class, max_connections=max_connections, timeout=None,
        **pool.connection_kwargs)
    client.connection_pool.disconnect()
    return redis.Redis(connection_pool=blocking)


class Client(ClientBase[Handle]):
    """``Client(url).enqueue("text", model="minilm")`` then ``handle.result(timeout=30)``."""

    handle_type = Handle

    def __init__(self, url: str | ConnectionSettings | None = None, *,
                 options: ClientOptions | None = None, **redis_kwargs: Any) -> None:
        """``url`` is a URL (default ``$INFERQ_REDIS_URL``; TLS files from ``$INFERQ_TLS_*``)
        or a ``ConnectionSettings``; ``redis_kwargs`` go to redis-py and win over both."""
        super().__init__(url, options)
        # A blocking pool: more concurrent calls than connections wait for one instead of
        # failing. Waiting for results holds no connection (see ``SyncResultInbox``).
        self.redis: redis.Redis = blocking_pool_client(
            connection.sync_client(self.connection, **{**BLOCKING_DEFAULTS, **redis_kwargs}),
            self.options.max_connections)
        self.scripts = ops.register(self.redis)
        #: The gateway's API keys (``inferq keys``): ``client.keys.create("acme")``.
        self.keys = KeyStore(self.redis, self.options.namespace)
        self._inboxes: dict[QueueKeys, SyncResultInbox] = {}
        self._inbox_lock = threading.Lock()

    def _run(self, plan: Plan[T]) -> T:
        with wrap_connection_errors(self.connection):
            return plans.run(self.redis, plan)

    def inbox(self, keys: QueueKeys) -> SyncResultInbox:
        with self._inbox_lock:
            box = self._inboxes.get(keys)
            if box is None:
                box = self._inboxes[keys] = SyncResultInbox(self.redis, keys, self.client_id)
            return box

    def queue_settings(self, keys: QueueKeys) -> QueueSettings:
        """The queue's settings (shards, depth limit), cached ``options.settings_ttl_s``."""
        return self._run(self._settings_plan(keys))

    def enqueue(self, prompt: str = "", **request: Unpack[EnqueueOptions]) -> Handle:
        """Queue one request and return its ``Handle``. Keyword arguments (``EnqueueOptions``):

        * ``model`` (required), ``task`` (``"embed"``, ``"generate"``, ``"score"``): the queue;
        * ``priority``: in [-100, 100], default 0; higher is served first, FIFO within one;
        * ``deadline_s``: still queued when it passes, the request is answered ``expired``;
        * ``id``: idempotency key (default random): an existing id returns that request;
        * ``params``: task parameters; ``generate`` takes ``max_new_tokens``,
          ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``ignore_eos``,
          ``repetition_penalty``, ``min_p``, ``min_tokens``, ``stop_token_ids``, ``logprobs``
          and ``top_logprobs`` (``inferq.protocol.generation.GenerationParams``);
        * ``max_attempts``: runs allowed (default 3); a run counts when a worker starts it,
          not when it claims it; after the last failed or lost run it is dead-lettered;
        * ``messages``: ``generate`` chat input, ``[{"role", "content"}]`` (empty prompt);
          ``content`` is a string or a list of text parts (joined with newlines);
        * ``tenant``: who sends it (names as queue names): within a priority, tenants share
          the queue by cost and weight (``inferq queue set --tenant-weight``); without one,
          a request is in the default flow, FIFO within its priority;
        * ``cost``: a custom task's cost in the tenant's account (default 1; the built-in
          tasks estimate theirs from the text);
        * ``ttft_slo_ms``: the latency objective, ms from enqueue to the first token
          (``generate``) or the result: ``Result.slo_met`` says whether it was met; the queue
          may order by it and refuse what would miss it (``inferq queue set --order
          deadline --admission predicted``: ``WouldMissSlo``);
        * ``session``: the conversation a ``generate`` request belongs to (cache affinity:
          docs/guides/cache-affinity.md).

        * ``traceparent``, ``tracestate``: the W3C trace context the request continues
          (default: the caller's current OpenTelemetry context when tracing is on;
          docs/guides/tracing.md).

        Raises ``ValidationError``, ``QueueFull`` or ``BackendUnavailable``."""
        return self._run(self._enqueue(prompt, request))

    def enqueue_many(self, requests: Iterable[str | Mapping[str, Any]], *,
                     atomic: bool = False, **defaults: Any) -> list[Handle]:
        """Enqueue many requests in one round trip (one script call per queue, pipelined).

        Each request is a prompt or a mapping of ``enqueue`` keyword arguments; ``defaults``
        (e.g. ``model=``) apply to all. Raises ``QueueFull`` if any was refused; its
        ``accepted`` attribute lists the handles that did get in. ``atomic=True``: all or
        none, in one script call; if back-pressure would refuse any, none is queued (every
        request must then go to one queue shard: ``ValidationError`` otherwise).
        With tracing on, one ``enqueue_many`` span covers the call and every request that
        names no ``traceparent`` of its own carries it.
        """
        return self._run(self._enqueue_many(requests, atomic, defaults))

    def results(self, handles: Sequence[Handle], timeout: float | None = None) -> list[Result]:
        """The ``Result`` of each handle, in order, waiting for those not in yet. Unlike
        ``Handle.result`` it does not raise for a failed, cancelled or expired request: each
        result says (``result.ok``, ``result.status``, ``result.error``). ``timeout`` (None:
        forever) bounds the whole wait; ``ResultTimeout`` if any result is still missing then.
        """
        HandleBase._checked(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        raws: list[Any] = []
        for handle in handles:
            # Once the deadline has passed, each remaining result gets one last look (a 1 ms
            # wait): a timeout of 0 is not a valid wait.
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            if handle._via_inbox:
                raws.append(handle._client.inbox(handle.keys).wait(handle.id, left))
            else:
                raws.append(handle._run(handle._wait(left)))
        return results_in_order([h.id for h in handles], raws, self.options, timeout)

    def live_workers(self, *, model: str, task: str = "embed") -> list[str]:
        """The ids of the workers serving ``task:model`` now (on any of its shards)."""
        return self._run(stats.all_live_workers(self._queue(model, task)))

    def served_queues(self) -> frozenset[str]:
        """The queues (``task:model``) some worker has ever served (the queue registry)."""
        return self._run(stats.served_queues(self.options.namespace))

    def dead_letters(self, *, model: str, task: str = "embed") -> DeadLetters:
        """The queue's dead letters: ``list``, ``show``, ``requeue``, ``purge`` (see
        ``inferq.producer.admin``)."""
        return DeadLetters(self.redis, self.scripts, self.connection,
                           self._queue(model, task))

    def handle(self, request_id: str, *, model: str, task: str = "embed") -> Handle:
        """A handle for a request enqueued elsewhere (another process, an earlier run). On a
        sharded queue its shard comes from the queue's current shard count."""
        keys = self._queue(model, task)
        shards = self.queue_settings(keys).shards
        return Handle(self, keys.for_shard(shard_of(request_id, shards)), request_id, "unknown")

    def close(self) -> None:
        """Stop the inbox listeners and close the connections. As with redis-py, a closed
        client still works: a later call reconnects (and a later wait starts a listener)."""
        with self._inbox_lock:
            boxes = list(self._inboxes.values())
            self._inboxes.clear()
        for box in boxes:
            box.close()
        self.redis.close()
        if isinstance(self.redis, redis.Redis):
            self.redis.connection_pool.disconnect()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

