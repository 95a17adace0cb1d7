"""What the sync and async clients share: argument validation, request building and the
interpretation of replies and results."""

from __future__ import annotations

import dataclasses
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Required, TypedDict, TypeVar, cast

from inferq import cluster, tracing
from inferq.errors import (
    DeadlineExceeded,
    QueueFull,
    RequestCancelled,
    RequestFailed,
    ResultTimeout,
    ValidationError,
    WouldMissSlo,
)
from inferq.protocol import ops, scores, slo
from inferq.protocol.codec import (
    DEFAULT_LIMITS,
    Limits,
    Result,
    Status,
    build_request,
    decode_payload_fields,
    decode_result,
    decode_results,
    encode_request,
    pack,
)
from inferq.protocol.cost import estimate
from inferq.protocol.fields import HashState
from inferq.protocol.generation import check_task_params
from inferq.protocol.keys import DEFAULT_NAMESPACE, QueueKeys, shard_of
from inferq.protocol.prefix import affinity_of, prompt_prefixes
from inferq.protocol.settings import QueueSettings, settings_from_hash

#: Blocking reads are sliced (``inferq.producer.waits``) to stay under the read timeout
#: (``ConnectionSettings.socket_timeout``); keepalive also detects a dead peer.
BLOCKING_DEFAULTS: dict[str, Any] = {"socket_keepalive": True}


class EnqueueOptions(TypedDict, total=False):
    """The keyword arguments of every ``enqueue`` (``Client``, ``AsyncClient``,
    ``inferq.enqueue``), written once; see ``Client.enqueue``. ``prepare`` applies defaults."""

    model: Required[str]
    task: str
    priority: int
    deadline_s: float | None
    id: str | None
    params: Mapping[str, Any] | None
    max_attempts: int
    messages: Sequence[Mapping[str, Any]] | None
    tenant: str | None
    cost: int | None
    traceparent: str | None
    tracestate: str | None
    ttft_slo_ms: int | None
    session: str | None


ENQUEUE_KEYS = frozenset(EnqueueOptions.__annotations__)
#: The enqueue outcome of a request its tenant's limit refused.
TENANT_FULL = "tenant_full"


@dataclass(frozen=True, slots=True)
class Shedding:
    """Priority-aware back-pressure: the share of ``max_queue_depth`` each priority may fill.

    ``levels`` are ``(min_priority, fraction)`` pairs; a request uses the first level whose
    ``min_priority`` it reaches. By default low priority (< 0) is refused once the queue is half
    full, normal priority at 80 %, and high priority (>= 50) only at the full depth, so a flood
    of background work cannot lock out urgent requests.
    """

    levels: tuple[tuple[int, float], ...] = ((50, 1.0), (0, 0.8), (scores.PRIORITY_MIN, 0.5))

    def __post_init__(self) -> None:
        if not self.levels or self.levels[-1][0] > scores.PRIORITY_MIN:
            raise ValidationError(
                f"Shedding.levels must end with a level for priority {scores.PRIORITY_MIN}, "
                f"got {self.levels}")
        previous = None
        for min_priority, fraction in self.levels:
            if not 0 < fraction <= 1:
                raise ValidationError(f"Shedding fraction must be in (0, 1], got {fraction}")
            if previous is not None and (min_priority >= previous[0] or fraction > previous[1]):
                raise ValidationError(
                    "Shedding.levels must go from high to low priority with fractions that do "
                    f"not grow, got {self.levels}")
            previous = (min_priority, fraction)

    def limit(self, priority: int, max_depth: int) -> int:
        if max_depth <= 0:
            return 0
        for min_priority, fraction in self.levels:
            if priority >= min_priority:
                return max(1, int(max_depth * fraction))
        raise AssertionError("unreachable: the last level covers every priority")


@dataclass(frozen=True, slots=True)
class ClientOptions:
    namespace: str = DEFAULT_NAMESPACE
    #: Pending depth at which even the highest priority is refused (0 = unbounded).
    max_queue_depth: int = 1_000_000
    shedding: Shedding = Shedding()
    result_ttl_s: float = 3600.0
    limits: Limits = DEFAULT_LIMITS
    #: Connections of an ``AsyncClient``'s pool; more concurrent calls wait for a free one.
    max_connections: int = 32
    #: When ``enqueue``/``enqueue_many`` return: None (default) once Redis has the request in
    #: memory; ``"fsync"`` once WAITAOF confirms it reached the server's AOF on disk (Redis or
    #: Valkey >= 7.2 with ``appendonly yes``); ``"replica"`` once WAIT confirms at least one
    #: replica has it. Unconfirmed: ``DurabilityError`` (the request may still be queued).
    durability: str | None = None
    durability_timeout_s: float = 5.0
    #: How long a queue's settings (``inferq queue set``: shards, depth limit) read from Redis
    #: are reused before being read again.
    settings_ttl_s: float = 1.0
    #: Warn (``NoWorkerWarning``) after an enqueue to a queue no live worker serves; off, the
    #: check still registers the queue for ``inferq stats`` (the gateway answers 404 instead).
    warn_no_worker: bool = True

    def __post_init__(self) -> None:
        cluster.check_durability(self.durability, self.durability_timeout_s)
        if self.settings_ttl_s < 0:
            raise ValidationError(f"settings_ttl_s must be >= 0, got {self.settings_ttl_s}")
        if self.max_queue_depth < 0:
            raise ValidationError(f"max_queue_depth must be >= 0, got {self.max_queue_depth}")
        if self.max_connections < 2:
            raise ValidationError(f"max_connections must be >= 2, got {self.max_connections}")
        if not self.result_ttl_s > 0:
            raise ValidationError(f"result_ttl_s must be > 0, got {self.result_ttl_s}")


class RequestState(StrEnum):
    """Where a request is: waiting (its hash's ``fields.HashState``) or finished (its result's
    ``Status``: the same names and values, taken from there), or ``UNKNOWN``."""

    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    OK = Status.OK.value
    FAILED = Status.FAILED.value
    CANCELLED = Status.CANCELLED.value
    EXPIRED = Status.EXPIRED.value
    DEAD = Status.DEAD.value
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, status: Status) -> RequestState:
        """The state of a request whose result has this status."""
        return _FINISHED[status]


#: Every ``Status`` is a finished state (a ``Status`` added without its state fails here, at
#: import); every ``HashState`` a waiting one.
_FINISHED = {status: RequestState[status.name] for status in Status}
_WAITING = {HashState.PENDING: RequestState.PENDING, HashState.INFLIGHT: RequestState.RUNNING,
            HashState.DELAYED: RequestState.RETRYING}
_WAITING_BYTES = {state.value.encode(): request_state for state, request_state in _WAITING.items()}


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request ready for the enqueue script."""

    keys: QueueKeys
    item: ops.EnqueueItem
    task: str
    model: str
    priority: int = 0


def prepare(prompt: object, request: Mapping[str, Any], options: ClientOptions,
            reply_to: str | None = None) -> Prepared:
    """Validate one request (``enqueue``'s arguments, see ``EnqueueOptions``) into the
    enqueue script's item. Unknown or missing arguments are a ``TypeError``, as for a
    function's own keywords."""
    unknown = sorted(request.keys() - ENQUEUE_KEYS)
    if unknown:
        raise TypeError(f"enqueue() got an unexpected keyword argument {unknown[0]!r}")
    if "model" not in request:
        raise TypeError("enqueue() missing 1 required keyword-only argument: 'model'")
    fields = {"task": "embed", **request}  # the other defaults are ``RequestPayload``'s
    if fields.get("id") is None:
        fields["id"] = uuid.uuid4().hex
    if (params := fields.get("params")) is not None:
        if not isinstance(params, Mapping):
            raise ValidationError(f"params must be a mapping, got {type(params).__name__}")
        fields["params"] = dict(params)
    payload = build_request(prompt, **fields)
    # generate/score params are checked here too, so a typo fails at enqueue, not in a worker.
    check_task_params(payload.task, payload.params, payload.messages is not None)
    keys = QueueKeys.for_model(payload.task, payload.model, options.namespace)
    item = ops.EnqueueItem(
        depth_limit=options.shedding.limit(payload.priority, options.max_queue_depth),
        id=payload.id,
        band=scores.band(payload.priority),
        payload=encode_request(payload, options.limits),
        deadline_ms=None if payload.deadline_s is None else max(1, round(payload.deadline_s * 1e3)),
        max_attempts=payload.max_attempts,
        reply_to=reply_to,
        tenant=payload.tenant or "",
        cost=payload.fair_cost,
        slo_ms=payload.ttft_slo_ms or 0,
        **affinity_of(payload),
    )
    return Prepared(keys=keys, item=item, task=payload.task, model=payload.model,
                    priority=payload.priority)


class SettingsCache:
    """Queue settings (``inferq queue set``) read from Redis, reused for ``ttl_s``: with one
    shard and the default depth, that read is the only extra cost, one HGETALL a second."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[QueueKeys, tuple[float, QueueSettings]] = {}

    def get(self, keys: QueueKeys) -> QueueSettings | None:
        known = self._known.get(keys)
        if known is None or known[0] <= self.clock():
            return None
        return known[1]

    def put(self, keys: QueueKeys, raw: Mapping[Any, Any],
            service_rate: float | None = None) -> QueueSettings:
        settings = dataclasses.replace(settings_from_hash(raw), service_rate=service_rate)
        self._known[keys] = (self.clock() + self.ttl_s, settings)
        return settings


def queue_of(keys: QueueKeys) -> QueueKeys:
    """Shard 0 of a queue: where its settings live and what the cache is keyed by."""
    return keys.for_shard(0)


def route(prepared: Prepared, settings: QueueSettings, options: ClientOptions) -> Prepared:
    """The request on its shard (``shard_of`` its id: a repeated id meets its first copy), with
    its share of the queue's depth limit. The limit (the queue's ``max_depth`` if set, else
    ``max_queue_depth``, times the priority's ``Shedding`` fraction) is split evenly over the
    shards: each shard sheds at ``ceil(limit / shards)`` pending requests. The tenant's weight
    is the queue's (``inferq queue set --tenant-weight``), read with the settings."""
    max_depth = settings.max_depth if settings.max_depth is not None else options.max_queue_depth
    limit = options.shedding.limit(prepared.priority, max_depth)
    if limit and settings.shards > 1:
        limit = math.ceil(limit / settings.shards)
    keys = prepared.keys.for_shard(shard_of(prepared.item.id, settings.shards))
    weight = settings.weight(prepared.item.tenant)
    tenant_limit = settings.tenant_limit(prepared.item.tenant)
    if tenant_limit and settings.shards > 1:
        tenant_limit = math.ceil(tenant_limit / settings.shards)
    policy = slo.policy(settings.order, None if settings.service_rate is None
                        else settings.service_rate / settings.claim_shards)
    if (keys == prepared.keys and limit == prepared.item.depth_limit
            and weight == prepared.item.weight and tenant_limit == prepared.item.tenant_limit
            and policy == prepared.item.policy):
        return prepared
    return dataclasses.replace(prepared, keys=keys, item=dataclasses.replace(
        prepared.item, depth_limit=limit, weight=weight, tenant_limit=tenant_limit,
        policy=policy))


def route_many(prepared: Sequence[Prepared], settings: Callable[[QueueKeys], QueueSettings],
               options: ClientOptions) -> list[Prepared]:
    """``route`` of each request, with ``settings`` of each queue asked once; on a queue of
    one shard, requests alike in what routing reads (priority, tenant, and the limits they
    carry) share one decision."""
    known: dict[int, QueueSettings] = {}
    same: dict[tuple[Any, ...], bool] = {}
    out = []
    for p in prepared:
        queue = known.get(id(p.keys))
        if queue is None:
            queue = known[id(p.keys)] = settings(p.keys)
        if queue.shards == 1:
            item = p.item
            alike = (id(p.keys), p.priority, item.tenant, item.depth_limit, item.weight,
                     item.tenant_limit, item.policy)
            unchanged = same.get(alike)
            if unchanged is None:
                unchanged = same[alike] = route(p, queue, options) is p
            if unchanged:
                out.append(p)
                continue
        out.append(route(p, queue, options))
    return out


def prepare_many(
    requests: Iterable[str | Mapping[str, Any]], defaults: Mapping[str, Any],
    options: ClientOptions, reply_to: str | None = None,
) -> list[Prepared]:
    """Each request is a prompt or a mapping of ``enqueue`` keyword arguments (with ``prompt``);
    ``defaults`` fills what a mapping leaves out. A list of plain prompts takes
    ``_prepare_prompts``, which gives the same requests for less CPU."""
    if isinstance(requests, str | bytes | Mapping) or not isinstance(requests, Iterable):
        raise ValidationError(
            f"requests must be a list of prompts or mappings, got {type(requests).__name__}")
    requests = requests if isinstance(requests, Sequence) else list(requests)
    if (len(requests) > 1 and defaults.get("id") is None and defaults.get("messages") is None
            and all(type(r) is str for r in requests)):
        return _prepare_prompts(cast("Sequence[str]", requests), defaults, options, reply_to)
    return [_prepare_one(index, request, defaults, options, reply_to)
            for index, request in enumerate(requests)]


def _prepare_one(index: int, request: object, defaults: Mapping[str, Any],
                 options: ClientOptions, reply_to: str | None) -> Prepared:
    """``prepare`` of request #index of ``prepare_many``, its errors naming the index."""
    spec: dict[str, Any] = dict(defaults)
    if isinstance(request, str):
        spec["prompt"] = request
    elif isinstance(request, Mapping):
        spec.update(request)
    else:
        raise ValidationError(
            f"request #{index} must be a str or a mapping, got {type(request).__name__}"
        )
    if "prompt" not in spec or "model" not in spec:
        raise ValidationError(f"request #{index} needs a prompt and a model")
    prompt = spec.pop("prompt")
    try:
        return prepare(prompt, spec, options, reply_to)
    except TypeError as exc:  # an unknown keyword in the mapping
        raise ValidationError(f"request #{index}: {exc}") from exc
    except ValidationError as exc:
        raise type(exc)(f"request #{index}: {exc.message}", field=exc.field) from exc


def uuid4_hexes(n: int) -> list[str]:
    """``[uuid.uuid4().hex for _ in range(n)]``, from one read of the OS's randomness: the
    same random version-4 UUIDs, without building a ``UUID`` each."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes((b & 0x0F) | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes((b & 0x3F) | 0x80 for b in raw[8::16])  # RFC 4122 variant
    text = raw.hex()
    return [text[i:i + 32] for i in range(0, 32 * n, 32)]


def _prepare_prompts(prompts: Sequence[str], defaults: Mapping[str, Any],
                     options: ClientOptions, reply_to: str | None) -> list[Prepared]:
    """``prepare_many`` of plain prompts sharing ``defaults``: the first is prepared (and so
    every argument validated) by ``prepare``; the others differ from it only in their id,
    prompt, payload and cost, so each takes a copy of its payload's fields with those
    replaced, checked as ``prepare`` checks them (a non-blank prompt of valid Unicode within
    the size limits). A prompt that fails a check goes through ``prepare``, which raises the
    same error as for a list of mappings. ``tests/unit/test_prepare_prompts.py`` proves the
    requests equal to ``prepare``'s."""
    first = _prepare_one(0, prompts[0], defaults, options, reply_to)
    template = decode_payload_fields(first.item.payload)
    task, params, cost = template["task"], template["params"], defaults.get("cost")
    item, limits = first.item, options.limits
    out = [first]
    ids = uuid4_hexes(len(prompts) - 1)
    for index in range(1, len(prompts)):
        prompt = prompts[index]
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError:
            size = -1
        payload = b""
        if 0 <= size <= limits.max_prompt_bytes and prompt.strip():
            template["id"], template["prompt"] = ids[index - 1], prompt
            payload = pack(template)
        if not payload or len(payload) > limits.max_payload_bytes:
            out.append(_prepare_one(index, prompt, defaults, options, reply_to))
            continue
        out.append(Prepared(first.keys, ops.EnqueueItem(
            template["id"], item.band, payload, item.deadline_ms, item.max_attempts,
            item.reply_to, item.depth_limit, item.tenant, item.weight,
            estimate(task, size, params, cost), item.tenant_limit, item.slo_ms, item.policy,
            item.session, prompt_prefixes(prompt) if item.prefixes else ""),
            first.task, first.model, first.priority))
    return out


def group_by_queue(prepared: Sequence[Prepared]) -> dict[QueueKeys, list[int]]:
    groups: dict[QueueKeys, list[int]] = {}
    for index, p in enumerate(prepared):
        groups.setdefault(p.keys, []).append(index)
    return groups


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


def check_full(reply: ops.EnqueueReply, prepared: Prepared, options: ClientOptions) -> None:
    late = slo.late_ms(reply.outcomes[0]) if reply.outcomes else None
    if late is not None:
        raise WouldMissSlo(
            f"request refused: predicted {late} ms to its result on queue "
            f"{prepared.keys.queue}, its objective is {prepared.item.slo_ms} ms; retry after "
            f"{reply.retry_after_ms / 1e3:.1f} s", predicted_ms=late,
            slo_ms=prepared.item.slo_ms, depth=reply.depth,
            retry_after_s=reply.retry_after_ms / 1e3)
    if reply.outcomes == [TENANT_FULL]:
        raise QueueFull(
            f"tenant {prepared.item.tenant!r} is at its limit of "
            f"{prepared.item.tenant_limit} unfinished requests on queue "
            f"{prepared.keys.queue}; retry after {reply.retry_after_ms / 1e3:.1f} s",
            depth=reply.depth, max_depth=prepared.item.tenant_limit,
            retry_after_s=reply.retry_after_ms / 1e3, tenant=prepared.item.tenant)
    if reply.outcomes and all(o == "full" for o in reply.outcomes):
        raise QueueFull(
            f"queue {prepared.keys.queue} is full for this priority ({reply.depth} pending, "
            f"limit {prepared.item.depth_limit}); retry after "
            f"{reply.retry_after_ms / 1e3:.1f} s",
            depth=reply.depth, max_depth=prepared.item.depth_limit,
            retry_after_s=reply.retry_after_ms / 1e3,
        )


def raise_for_status(result: Result) -> Result:
    """Return an ok result; raise the typed error that matches any other outcome."""
    if result.status is Status.OK:
        return result
    message = result.error.message if result.error else result.status.value
    code = result.error.code if result.error else result.status.value
    text = f"request {result.id} {result.status.value}: [{code}] {message}"
    if result.status is Status.CANCELLED:
        raise RequestCancelled(text, result=result)
    if result.status is Status.EXPIRED:
        raise DeadlineExceeded(text, result=result)
    raise RequestFailed(text, result=result)


def results_in_order(ids: Sequence[str], raws: Sequence[Any], options: ClientOptions,
                     timeout: float | None) -> list[Result]:
    """``results()``: every raw result parsed, in order, or ``ResultTimeout`` naming how many
    are missing."""
    results = parse_results(raws, options)
    missing = [request_id for request_id, r in zip(ids, results, strict=True) if r is None]
    if missing:
        raise ResultTimeout(f"{len(missing)} of {len(ids)} results missing after {timeout} s "
                            f"(the first: request {missing[0]})")
    return cast("list[Result]", results)


def parse_results(raws: Sequence[Any], options: ClientOptions) -> list[Result | None]:
    """``parse_result`` of each (one pydantic call for all of them; only when that refuses
    one is each parsed alone, which raises what ``parse_result`` raises)."""
    datas = [raw.encode() if isinstance(raw, str) else bytes(raw)
             for raw in raws if raw is not None]
    try:
        decoded = iter(decode_results(datas, options.limits))
    except ValidationError:
        return [parse_result(raw, options) for raw in raws]
    return [None if raw is None else next(decoded) for raw in raws]


def parse_result(raw: Any, options: ClientOptions) -> Result | None:
    if raw is None:
        return None
    return decode_result(raw.encode() if isinstance(raw, str) else bytes(raw), options.limits)


def block_timeout(timeout: float | None) -> int:
    """BLMOVE's timeout argument: 0 blocks forever; Redis takes fractional seconds, though
    redis-py annotates it as int."""
    if timeout is None:
        return 0
    if not timeout > 0:
        raise ValidationError(f"timeout must be > 0 seconds or None, got {timeout}")
    return timeout  # type: ignore[return-value]


def state_of(hash_state: bytes | None, raw_result: bytes | None,
             options: ClientOptions) -> RequestState:
    """A request's state from its hash's ``Field.STATE`` and its stored result (either may be
    None)."""
    if raw_result is not None:
        return RequestState.of(decode_result(raw_result, options.limits).status)
    return _WAITING_BYTES.get(hash_state or b"", RequestState.UNKNOWN)


H = TypeVar("H")


def collect_handles(
    prepared: Sequence[Prepared], groups: Mapping[QueueKeys, list[int]], replies: Sequence[Any],
    options: ClientOptions, make_handle: Callable[[QueueKeys, str, str], H],
) -> list[H]:
    """Turn the pipelined enqueue replies into handles, in request order."""
    handles: list[H | None] = [None] * len(prepared)
    refused: list[int] = []
    tenants: set[str] = set()
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
            if outcome in ("full", TENANT_FULL) or predicted is not None:
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


#: One enqueue script call: a queue shard and the items for it.
EnqueueGroup = tuple[QueueKeys, Sequence[ops.EnqueueItem]]


def _calls(script: Any, groups: Sequence[EnqueueGroup],
           atomic: bool = False) -> list[cluster.ScriptCall]:
    return [(script, *ops.enqueue_call(keys, items, atomic=atomic)) for keys, items in groups]


def check_atomic(groups: Mapping[QueueKeys, Any]) -> None:
    """All-or-none is one script call: it needs every request in one queue shard."""
    if len(groups) > 1:
        raise ValidationError(
            f"atomic enqueue_many needs every request in one queue shard (one Redis slot), "
            f"got {len(groups)}: {sorted(k.tag for k in groups)}", field="atomic")


def enqueue_sync(client: Any, script: Any, groups: Sequence[EnqueueGroup],
                 options: ClientOptions, atomic: bool = False) -> list[Any]:
    """The enqueue script's raw replies, one per group: one EVALSHA for one group, else one
    pipelined round trip (per node on a cluster); with ``options.durability``, each node's
    calls are followed by WAITAOF/WAIT on the same connection."""
    calls = _calls(script, groups, atomic)
    if options.durability is not None:
        return cluster.run_durable(client, calls, options.durability,
                                   options.durability_timeout_s)
    if len(calls) == 1:
        _, keys, args = calls[0]
        return [script(keys=keys, args=args)]
    return cluster.run_scripts(client, calls)


async def enqueue_async(client: Any, script: Any, groups: Sequence[EnqueueGroup],
                        options: ClientOptions, atomic: bool = False) -> list[Any]:
    """``enqueue_sync`` on an asyncio client."""
    calls = _calls(script, groups, atomic)
    if options.durability is not None:
        return await cluster.run_durable_async(client, calls, options.durability,
                                               options.durability_timeout_s)
    if len(calls) == 1:
        _, keys, args = calls[0]
        return [await script(keys=keys, args=args)]
    return await cluster.run_scripts_async(client, calls)
