"""Per-tenant limits in Redis, shared by every gateway replica: requests and tokens per minute
as token buckets, requests in flight, and payload bytes waiting in Redis.

``Limiter.admit`` reserves, atomically (``limit_scripts.LIMITS``), one request per id and the
caller's token estimate, an in-flight slot and the payload's bytes, each reservation
expiring after ``ttl_s`` (a request whose settle never comes stops counting then). It decides
before it writes: a refusal changes nothing and says which limit refused and when to retry.
``Limiter.settle`` gives back what a finished request reserved beyond its actual tokens, and
frees its slot and bytes, once per id. A principal without limits (or without a tenant) costs
no Redis call at all.

The buckets hold at most the per-minute limit and refill continuously, so a tenant can burst
up to a minute's worth and then runs at its rate. Settling may also take more than was
reserved (a generation longer than its estimate): the token bucket then goes below zero (never
below minus its capacity) and the next requests wait for it to refill.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from inferq.errors import ValidationError
from inferq.protocol.codec import Result, Status
from inferq.protocol.keys import DEFAULT_NAMESPACE, TenancyKeys
from inferq.protocol.ops import as_str, packed
from inferq.tenancy.limit_scripts import LIMITS
from inferq.tenancy.principal import Principal

LimitName = Literal["requests", "tokens", "in_flight", "queued_bytes"]
LIMIT_NAMES: tuple[LimitName, ...] = ("requests", "tokens", "in_flight", "queued_bytes")
#: Ids one call may reserve or settle (every id is one script argument row).
MAX_IDS = 4096
#: How long a deferred settlement (``Limiter.settle_soon``) waits for its tenant's next
#: admission to carry it before it goes on its own.
SETTLE_DELAY_S = 0.05
#: Tenants whose encoded keys a limiter keeps (cleared whole when full).
KEY_CACHE = 4096
log = logging.getLogger("inferq.tenancy")


@dataclass(frozen=True, slots=True)
class Admission:
    """What an admission decided, and what the rate-limit headers need."""

    admitted: bool
    #: The limit that refused (the first of ``LIMIT_NAMES`` that did), None if admitted.
    limit: LimitName | None = None
    #: On refusal: whole seconds until every refusing limit could admit (at least 1).
    retry_after_s: int = 0
    #: The same in milliseconds, as the script computed it (for a waiting batch).
    retry_after_ms: int = 0
    requests_limit: int | None = None
    requests_remaining: int = 0
    #: ms until the requests bucket is full again (refused: until it holds the need).
    requests_reset_ms: int = 0
    tokens_limit: int | None = None
    tokens_remaining: int = 0
    tokens_reset_ms: int = 0
    in_flight: int = 0
    in_flight_limit: int | None = None
    queued_bytes: int = 0
    queued_bytes_limit: int | None = None
    #: What was asked: requests (new ids), tokens and bytes.
    asked_requests: int = 0
    asked_tokens: int = 0
    asked_bytes: int = 0

    @property
    def message(self) -> str:
        """Why it was refused, naming the limit ('' when admitted)."""
        if self.limit is None:
            return ""
        if self.limit == "requests":
            what = f"requests per minute ({self.requests_limit})"
            if self.asked_requests > (self.requests_limit or 0):
                return (f"rate limit reached: {self.asked_requests} requests at once is more "
                        f"than this key's {what}")
        elif self.limit == "tokens":
            what = f"tokens per minute ({self.tokens_limit})"
            if self.asked_tokens > (self.tokens_limit or 0):
                return (f"request too large: about {self.asked_tokens} tokens is more than "
                        f"this key's {what}")
        elif self.limit == "in_flight":
            what = f"requests in flight ({self.in_flight_limit}, {self.in_flight} now)"
        else:
            what = (f"queued bytes ({self.queued_bytes_limit}, {self.queued_bytes} held, "
                    f"{self.asked_bytes} asked)")
        return f"rate limit reached for {what}; retry after {self.retry_after_s} s"


UNLIMITED = Admission(admitted=True)


def actual_tokens(result: Result) -> int | None:
    """The tokens a finished request used: prompt + completion for a generation, the input
    tokens for embeddings; None (keep the estimate) for an ``ok`` result with neither, 0 for
    one that produced no output (failed, cancelled, expired, dead)."""
    if result.usage is not None:
        return result.usage.total_tokens
    if result.input_tokens is not None:
        return result.input_tokens
    return None if result.status is Status.OK else 0


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integers that differ by at most one and sum to it."""
    base, extra = divmod(max(0, total), parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def _limit(value: int | None) -> int:
    return value or 0


def parse_admission(principal: Principal, reply: Any, asked: tuple[int, int, int]
                    ) -> Admission:
    admitted = int(reply[0]) == 1
    limit = as_str(reply[1]) or None
    return Admission(
        admitted=admitted, limit=limit if limit in LIMIT_NAMES else None,
        retry_after_s=0 if admitted else max(1, math.ceil(int(reply[2]) / 1000)),
        retry_after_ms=0 if admitted else max(1, int(reply[2])),
        requests_limit=principal.requests_per_minute,
        requests_remaining=max(0, int(reply[3])), requests_reset_ms=max(0, int(reply[4])),
        tokens_limit=principal.tokens_per_minute,
        tokens_remaining=max(0, int(reply[5])), tokens_reset_ms=max(0, int(reply[6])),
        in_flight=int(reply[7]), in_flight_limit=principal.max_in_flight,
        queued_bytes=int(reply[8]), queued_bytes_limit=principal.max_queued_bytes,
        asked_requests=asked[0], asked_tokens=asked[1], asked_bytes=asked[2])


def admit_args(principal: Principal, ids: Sequence[str], estimate_tokens: int,
               payload_bytes: int, ttl_s: float,
               settle: Mapping[str, int | None] | None = None) -> list[str | int]:
    """An admission's arguments (``limit_scripts``; ``LimitCalls`` packs them)."""
    if not 1 <= len(ids) <= MAX_IDS:
        raise ValidationError(f"admit takes 1 to {MAX_IDS} ids, got {len(ids)}")
    if ttl_s <= 0:
        raise ValidationError(f"ttl_s must be positive, got {ttl_s}")
    args: list[str | int] = [
        principal.requests_per_minute or 0, principal.tokens_per_minute or 0,
        principal.max_in_flight or 0, principal.max_queued_bytes or 0,
        max(1, math.ceil(ttl_s * 1000)), len(settle) if settle else 0]
    if settle:
        for settled_id, tokens in settle.items():
            args += (settled_id, "" if tokens is None else max(0, int(tokens)))
    if len(ids) == 1:  # the usual call: no spreading
        args += (ids[0], max(0, estimate_tokens), max(0, payload_bytes))
        return args
    unique = list(dict.fromkeys(ids))
    for request_id, tokens, size in zip(unique, split(estimate_tokens, len(unique)),
                                        split(payload_bytes, len(unique)), strict=True):
        args += (request_id, tokens, size)
    return args


def settle_args(principal: Principal, actual: Iterable[tuple[str, int | None]]
                ) -> list[str | int]:
    """A settlement's arguments (``limit_scripts``)."""
    args: list[str | int] = [_limit(principal.requests_per_minute),
                             _limit(principal.tokens_per_minute)]
    for request_id, tokens in dict(actual).items():
        args += [request_id, "" if tokens is None else max(0, int(tokens))]
    if len(args) > 2 + 2 * MAX_IDS:
        raise ValidationError(f"settle takes at most {MAX_IDS} ids")
    return args


class LimitCalls:
    """The admissions and settlements of one event-loop turn, for any tenants, sent as ONE
    call of the limits script (``limit_scripts.LIMITS``: one EVALSHA, its calls packed into
    one argument), each caller awaiting its own reply: under load, the limit calls of
    concurrent HTTP calls share one round trip and one command, as their enqueues do
    (``gateway.coalesce``). The calls run one after the other inside the script, so each is
    atomic; a Redis failure reaches every caller of that round trip."""

    def __init__(self, redis: Any) -> None:
        self.script = redis.register_script(LIMITS)
        self._pending: list[tuple[str, list[bytes], list[Any], asyncio.Future[Any]]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Round trips sent and calls carried (for tests and logs).
        self.round_trips = 0
        self.calls = 0

    async def call(self, kind: str, keys: list[bytes], args: list[Any]) -> Any:
        """One call: ``kind`` ``admit`` or ``settle``, on a tenant's three keys."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((kind, keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        # A caller cancelled meanwhile cancels only its own future: the round trip goes on,
        # and its reply is dropped (``_send`` skips a future that is done).
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[str, list[bytes], list[Any], asyncio.Future[Any]]]
                    ) -> None:
        self.round_trips += 1
        self.calls += len(batch)
        keys: list[bytes] = []
        first: dict[bytes, int] = {}  # a tenant's bucket key -> its index in KEYS (1-based)
        calls: list[tuple[str, int, list[Any]]] = []
        for kind, tenant_keys, args, _ in batch:
            at = first.get(tenant_keys[0])
            if at is None:
                at = first[tenant_keys[0]] = len(keys) + 1
                keys += tenant_keys
            calls.append((kind, at, args))
        try:
            replies = await self.script(keys=keys, args=[packed(calls)])
        except BaseException as exc:
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)


class Limiter:
    """The limits of every principal, on an asyncio redis client (what the gateway holds).

    ``admit`` and ``settle`` are one call each of the limits script (EVALSHA, loaded on first
    use), in the tenancy slot, riding one script call with the other calls of their loop turn
    (``LimitCalls``); they never raise for a refusal (``Admission.admitted`` says it),
    only for a Redis failure."""

    def __init__(self, redis: Any, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.redis = redis
        self.names = TenancyKeys(namespace)
        self.batcher = LimitCalls(redis)
        #: Settlements waiting to ride on their tenant's next admission: tenant ->
        #: (principal, id -> actual tokens).
        self._owed: dict[str, tuple[Principal, dict[str, int | None]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[int]] = set()
        self._keys: dict[str, list[bytes]] = {}

    def keys(self, tenant: str) -> list[bytes]:
        """The tenant's three keys, encoded once per tenant (a bytes argument costs redis-py's
        command packer nothing to encode)."""
        got = self._keys.get(tenant)
        if got is None:
            if len(self._keys) >= KEY_CACHE:
                self._keys.clear()
            got = [self.names.limits(tenant).encode(), self.names.in_flight(tenant).encode(),
                   self.names.queued_bytes(tenant).encode()]
            self._keys[tenant] = got
        return got

    async def admit(self, principal: Principal, ids: Sequence[str], estimate_tokens: int,
                    payload_bytes: int, ttl_s: float) -> Admission:
        """Reserve one request per id (repeats of a live id are free), ``estimate_tokens``
        and ``payload_bytes`` (spread over the ids), for at most ``ttl_s`` seconds."""
        if principal.tenant is None or not principal.limited:
            return UNLIMITED
        owed = self._owed.pop(principal.tenant, None)
        args = admit_args(principal, ids, estimate_tokens, payload_bytes, ttl_s,
                          owed[1] if owed is not None else None)
        reply = await self.batcher.call("admit", self.keys(principal.tenant), args)
        return parse_admission(principal, reply, (len(set(ids)), estimate_tokens,
                                                  payload_bytes))

    async def settle(self, principal: Principal,
                     actual: Iterable[tuple[str, int | None]]) -> int:
        """Give back what each id reserved beyond its actual tokens (None: unknown, the
        reservation stands) and free its slot and bytes; the ids settled (each once)."""
        if principal.tenant is None or not principal.limited:
            return 0
        args = settle_args(principal, actual)
        if len(args) == 2:
            return 0
        return int(await self.batcher.call("settle", self.keys(principal.tenant), args))

    def settle_soon(self, principal: Principal, actual: Iterable[tuple[str, int | None]]
                    ) -> None:
        """``settle``, without waiting: the settlement rides on this tenant's next admission
        on this gateway (one script call instead of two per request), or goes on its own
        after ``SETTLE_DELAY_S`` if none comes. A tenant's next admission always sees it
        first, so its in-flight count and buckets are exact for its own next call; another
        gateway sees it within the delay. Lost with the process if it dies meanwhile (the
        reservations then expire)."""
        if principal.tenant is None or not principal.limited:
            return
        owed = self._owed.setdefault(principal.tenant, (principal, {}))[1]
        owed.update(actual)
        if len(owed) >= MAX_IDS:
            self._flush_owed()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SETTLE_DELAY_S,
                                                                self._flush_owed)

    def _flush_owed(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        owed, self._owed = self._owed, {}
        for principal, actual in owed.values():
            task = asyncio.get_running_loop().create_task(self.settle(principal, actual.items()))
            self._tasks.add(task)
            task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[int]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a deferred settlement failed (its reservations will expire): %s",
                        task.exception())
