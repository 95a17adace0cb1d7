"""Sending prepared requests: the enqueue script's calls as one plan (``enqueue``: one EVALSHA,
a pipelined round, or durable writes), the replies turned into handles (``collect_handles``),
and the producer's trace span around it all (``traced``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from inferq import cluster, tracing
from inferq.errors import QueueFull, ValidationError, WouldMissSlo
from inferq.plans import Do, Plan
from inferq.producer import admission
from inferq.producer.options import ClientOptions
from inferq.producer.prepare import Prepared
from inferq.producer.replies import BACK_PRESSURE, TENANT_FULL
from inferq.protocol import ops, slo
from inferq.protocol.keys import QueueKeys

#: One enqueue script call: a queue shard and the items for it.
EnqueueGroup = tuple[QueueKeys, Sequence[ops.EnqueueItem]]
H = TypeVar("H")


def group_by_queue(prepared: Sequence[Prepared]) -> dict[QueueKeys, list[int]]:
    groups: dict[QueueKeys, list[int]] = {}
    for index, p in enumerate(prepared):
        groups.setdefault(p.keys, []).append(index)
    return groups


def check_atomic(groups: Mapping[QueueKeys, Any]) -> None:
    """All-or-none is one script call: it needs every request in one queue shard."""
    if len(groups) > 1:
        raise ValidationError(
            f"atomic enqueue_many needs every request in one queue shard (one Redis slot), "
            f"got {len(groups)}: {sorted(k.tag for k in groups)}", field="atomic")


def enqueue(client: Any, script: Any, groups: Sequence[EnqueueGroup], options: ClientOptions,
            atomic: bool = False) -> Plan[list[Any]]:
    """The enqueue script's raw replies, one per group: one EVALSHA for one group, else one
    pipelined round trip (per node on a cluster, retried through a failover); with
    ``options.durability``, each node's calls are followed by WAITAOF/WAIT on the same
    connection. ``client`` is the one the plan runs on."""
    calls = [(script, *ops.enqueue_call(keys, items, atomic=atomic)) for keys, items in groups]
    if options.durability is not None:
        return (yield from cluster.durable(client, calls, options.durability,
                                           options.durability_timeout_s))
    if len(calls) == 1:
        _, keys, args = calls[0]
        return [(yield Do(lambda: script(keys=keys, args=args)))]
    return (yield from cluster.retrying(lambda: cluster.script_round(calls),
                                        cluster.failover_timeout(client)))


def collect_handles(
    prepared: Sequence[Prepared], groups: Mapping[QueueKeys, list[int]], replies: Sequence[Any],
    options: ClientOptions, make_handle: Callable[[QueueKeys, str, str], H],
) -> list[H]:
    """Turn the pipelined enqueue replies into handles, in request order."""
    handles: list[H | None] = [None] * len(prepared)
    refused: list[int] = []
    tenants: set[str] = set()
    tokens: list[int] = []  # refused for their band's queued tokens
    late: tuple[int, int] | None = None  # the worst (predicted, asked) ms admission refused
    depth, retry_after_ms = 0, 0
    for (keys, indices), raw in zip(groups.items(), replies, strict=True):
        reply = ops.parse_enqueue(raw)
        depth = reply.depth
        retry_after_ms = max(retry_after_ms, reply.retry_after_ms)
        for row, (index, outcome) in enumerate(zip(indices, reply.outcomes, strict=True)):
            if outcome == TENANT_FULL:
                tenants.add(prepared[index].item.tenant)
            predicted = slo.late_ms(outcome)
            if predicted is not None:
                asked = prepared[index].item.slo_ms
                if late is None or predicted - asked > late[0] - late[1]:
                    late = (predicted, asked)
            if outcome == slo.TOKENS_FULL:
                tokens.append(index)
            if outcome in BACK_PRESSURE or predicted is not None:
                refused.append(index)
            else:
                handle = handles[index] = make_handle(keys, prepared[index].item.id, outcome)
                if row in reply.predicted_ms:
                    handle.predicted_ms = reply.predicted_ms[row]  # type: ignore[attr-defined]
    accepted = [h for h in handles if h is not None]
    if late is not None:
        raise WouldMissSlo(
            f"{len(refused)} of {len(prepared)} requests refused: one's predicted time to "
            f"its result is {late[0]} ms, its objective {late[1]} ms; retry after "
            f"{retry_after_ms / 1e3:.1f} s", predicted_ms=late[0], slo_ms=late[1],
            depth=depth, accepted=accepted, refused=sorted(refused),
            retry_after_s=retry_after_ms / 1e3)
    if tokens and len(tokens) == len(refused):
        worst = max(tokens, key=lambda i: prepared[i].item.cost)
        raise admission.tokens_full(
            prepared[worst].keys.queue, prepared[worst].item.cost, prepared[worst].item.policy,
            depth, retry_after_ms, refused=refused, total=len(prepared), accepted=accepted)
    if refused:
        max_depth = max(prepared[i].item.depth_limit for i in refused)
        why = "queue full for their priority" + (
            f" or tenant {', '.join(map(repr, sorted(tenants)))} at its limit" if tenants
            else "")
        raise QueueFull(
            f"{len(refused)} of {len(prepared)} requests refused: {why} (max depth "
            f"{max_depth} per shard); retry after {retry_after_ms / 1e3:.1f} s",
            depth=depth, max_depth=max_depth,
            accepted=accepted, refused=sorted(refused), retry_after_s=retry_after_ms / 1e3,
            tenant=min(tenants) if len(tenants) == 1 else None,
        )
    return accepted


def explicit_parent(request: Mapping[str, Any]) -> tracing.Parent | None:
    """The ``traceparent=`` (and ``tracestate=``) a caller gave, checked."""
    traceparent = request.get("traceparent")
    if traceparent is None:
        return None
    try:
        tracing.check_traceparent(str(traceparent))
        if (state := request.get("tracestate")) is not None:
            tracing.check_tracestate(str(state))
    except ValueError as exc:
        raise ValidationError(str(exc), field="traceparent") from exc
    return tracing.Parent(str(traceparent), request.get("tracestate"))


@contextmanager
def traced(tracer: Any, name: str, requests: object,
           defaults: Mapping[str, Any]) -> Iterator[tuple[Any, tracing.TraceFields]]:
    """The producer's span around an enqueue of ``requests`` (prompts or mappings, over
    ``defaults``: ``tracing.enqueue_span``, child of the ``traceparent`` in ``defaults``, else
    of the caller's current context, linked to the contexts requests carry of their own), and
    the fields that make the other requests' payloads carry it."""
    parent = explicit_parent(defaults)
    # What is not a list of requests is refused by the enqueue itself, inside the span.
    if not isinstance(requests, Sequence) or isinstance(requests, str | bytes):
        requests = ()
    first = requests[0] if requests else ""
    spec = {**defaults, **first} if isinstance(first, Mapping) else defaults
    links: dict[tuple[str, str | None], tracing.Parent] = {}
    if name == "enqueue_many":
        for request in requests:
            if isinstance(request, Mapping) and request.get("traceparent") is not None:
                own = explicit_parent(request)
                if own is not None and len(links) < tracing.MAX_LINKS:
                    links.setdefault((own.traceparent, own.tracestate), own)
    with tracing.enqueue_span(tracer, name, spec, len(requests), parent,
                              list(links.values())) as span:
        mine = tracing.w3c_of(span)
        yield span, (mine.fields() if mine is not None
                     else parent.fields() if parent is not None else {})
