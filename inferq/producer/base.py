"""What ``Client`` and ``AsyncClient`` share: their state, and every enqueue written once as a
plan (``inferq.plans``) that each client runs with its own driver: the sync one, or the async
one. The rules (validation, routing, refusals, tracing, the presence check) live here and in
the modules they call; the two clients hold only their I/O."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from inferq import connection, tracing
from inferq.connection import ConnectionSettings
from inferq.plans import Plan
from inferq.producer import admission, send
from inferq.producer.handle import HandleBase
from inferq.producer.options import ClientOptions
from inferq.producer.prepare import Prepared, prepare, prepare_many
from inferq.producer.presence import WorkerPresence
from inferq.producer.replies import check_full
from inferq.producer.routing import SettingsCache, queue_of, route, route_many
from inferq.protocol import ops
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import QueueSettings

H = TypeVar("H", bound=HandleBase[Any])


class ClientBase(Generic[H]):
    #: The handle a client makes (``Handle`` or ``AsyncHandle``).
    handle_type: ClassVar[type[Any]]
    redis: Any
    scripts: dict[str, Any]

    def __init__(self, url: str | ConnectionSettings | None,
                 options: ClientOptions | None) -> None:
        self.connection = connection.resolve(url)
        self.url = self.connection.url
        self.options = options or ClientOptions()
        self.client_id = uuid.uuid4().hex
        #: Warns (``NoWorkerWarning``) when a queue enqueued to has no live worker.
        self.presence = WorkerPresence(self.options.namespace,
                                       warn=self.options.warn_no_worker)
        self._settings = SettingsCache(self.options.settings_ttl_s)

    def _queue(self, model: str, task: str = "embed") -> QueueKeys:
        """The keys of queue ``task:model`` (shard 0) in this client's namespace."""
        return QueueKeys.for_model(task, model, self.options.namespace)

    def prepare(self, prompt: object, request: Mapping[str, Any], *,
                reply_to: str | None = None) -> Prepared:
        """One request (``enqueue``'s keyword arguments) validated into the enqueue script's
        item, as ``enqueue`` validates it, before any routing: bad input raises what
        ``enqueue`` raises. ``reply_to``: the list its result is announced on (default none)."""
        return prepare(prompt, request, self.options, reply_to)

    def _made(self, keys: QueueKeys, request_id: str, outcome: str) -> H:
        handle: H = self.handle_type(self, keys, request_id, outcome, via_inbox=True)
        return handle

    # ------------------------------------------------------------- plans, run by each client

    def _cached_settings(self, queue: QueueKeys) -> QueueSettings | None:
        """Settings of ``queue`` an enqueue may use without reading them first."""
        return self._settings.get(queue)

    def _settings_plan(self, keys: QueueKeys) -> Plan[QueueSettings]:
        """The queue's settings (shards, depth limit), cached ``options.settings_ttl_s``."""
        queue = queue_of(keys)
        return self._settings.get(queue) or self._settings.put(
            queue, *(yield from admission.read_settings(queue)))

    def _route(self, prepared: list[Prepared]) -> Plan[list[Prepared]]:
        # The cache is asked before a plan is made: a hit (nearly every call) costs no plan.
        settings: dict[int, QueueSettings] = {}
        for p in prepared:
            if id(p.keys) not in settings:
                settings[id(p.keys)] = (self._cached_settings(queue_of(p.keys))
                                        or (yield from self._settings_plan(p.keys)))
        return route_many(prepared, lambda keys: settings[id(keys)], self.options)

    def _presence(self, due: list[QueueKeys]) -> Plan[None]:
        """The presence check of the queues ``due`` (``presence.due``, asked by the caller:
        at most every few seconds per queue)."""
        idle = yield from self.presence.check(due)
        self.presence.warn_about(idle)

    def _enqueue(self, prompt: str, request: Mapping[str, Any]) -> Plan[H]:
        tracer = tracing.tracer()
        if tracer is None:
            return self._enqueue_plan(prompt, request)
        return self._traced_enqueue(tracer, prompt, request)

    def _traced_enqueue(self, tracer: Any, prompt: str, request: Mapping[str, Any]) -> Plan[H]:
        with send.traced(tracer, "enqueue", [""], request) as (span, context):
            handle = yield from self._enqueue_plan(prompt, {**request, **context})
            span.set_attribute("messaging.message.id", handle.id)
            return handle

    def _enqueue_plan(self, prompt: str, request: Mapping[str, Any]) -> Plan[H]:
        p = prepare(prompt, request, self.options, reply_to=self.client_id)
        settings = (self._cached_settings(queue_of(p.keys))
                    or (yield from self._settings_plan(p.keys)))
        p = route(p, settings, self.options)
        (raw,) = yield from send.enqueue(self.redis, self.scripts["enqueue"],
                                         [(p.keys, [p.item])], self.options)
        reply = ops.parse_enqueue(raw)
        check_full(reply, p, self.options)
        if due := self.presence.due([p.keys]):
            yield from self._presence(due)
        handle = self._made(p.keys, p.item.id, reply.outcomes[0])
        handle.predicted_ms = reply.predicted_ms.get(0)
        return handle

    def _enqueue_many(self, requests: Iterable[str | Mapping[str, Any]], atomic: bool,
                      defaults: Mapping[str, Any]) -> Plan[list[H]]:
        tracer = tracing.tracer()
        if tracer is None:
            return self._enqueue_many_plan(requests, atomic, defaults)
        return self._traced_enqueue_many(tracer, requests, atomic, defaults)

    def _traced_enqueue_many(self, tracer: Any, requests: Iterable[str | Mapping[str, Any]],
                             atomic: bool, defaults: Mapping[str, Any]) -> Plan[list[H]]:
        if isinstance(requests, Iterable) and not isinstance(requests, Sequence | Mapping):
            requests = list(requests)  # read twice: by the span, and to enqueue
        with send.traced(tracer, "enqueue_many", requests, defaults) as (_, context):
            return (yield from self._enqueue_many_plan(requests, atomic,
                                                       {**defaults, **context}))

    def _enqueue_many_plan(self, requests: Iterable[str | Mapping[str, Any]], atomic: bool,
                           defaults: Mapping[str, Any]) -> Plan[list[H]]:
        prepared = yield from self._route(prepare_many(requests, defaults, self.options,
                                                       reply_to=self.client_id))
        groups = send.group_by_queue(prepared)
        if atomic:
            send.check_atomic(groups)
        replies = yield from send.enqueue(
            self.redis, self.scripts["enqueue"],
            [(keys, [prepared[i].item for i in indices]) for keys, indices in groups.items()],
            self.options, atomic)
        handles = send.collect_handles(prepared, groups, replies, self.options, self._made)
        if due := self.presence.due(groups):
            yield from self._presence(due)
        return handles

    def _enqueue_items(self, keys: QueueKeys,
                       items: Sequence[ops.EnqueueItem]) -> Plan[ops.EnqueueReply]:
        (raw,) = yield from send.enqueue(self.redis, self.scripts["enqueue"], [(keys, items)],
                                         self.options)
        return ops.parse_enqueue(raw)
