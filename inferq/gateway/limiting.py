"""The gateway's side of the per-tenant limits (``inferq.tenancy.limits``): admit a call
before it is queued (a refusal is a 429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*``
headers), and settle it once its results are known.

* ``admit_call``: one script call (none for a key without limits); raises ``ApiError`` 429
  with ``type`` ``rate_limit_error`` and ``code`` the limit (``requests``, ``tokens``,
  ``in_flight``, ``queued_bytes``), else returns the headers for the success response.
* ``settle_results``: the actual tokens of each ``Result`` (``usage`` for a generation, the
  worker's ``input_tokens`` for embeddings; neither: the estimate stands for an ``ok`` result
  and nothing is charged for one that did not run to an output).
* ``release``: give a reservation back whole (the enqueue failed, or the call was refused
  after admission).

The ids are the ids requests have in Redis (``Principal.stored_id``), the same at admission
and at settlement; a request whose settlement never comes (an async call whose result the
gateway does not read, a gateway that died) stops counting after ``ttl_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any
from weakref import WeakKeyDictionary

import anyio

from inferq.openai.errors import ApiError
from inferq.protocol import cost
from inferq.protocol.codec import Result
from inferq.protocol.keys import DEFAULT_NAMESPACE
from inferq.tenancy.headers import rate_limit_headers
from inferq.tenancy.limits import Limiter, actual_tokens
from inferq.tenancy.principal import Principal

#: What an admission reserves beyond the caller's own wait, before a lost request stops
#: counting (a result is written at most this long after the wait ends).
TTL_MARGIN_S = 60.0

log = logging.getLogger("inferq.gateway")
_limiters: WeakKeyDictionary[Any, dict[str, Limiter]] = WeakKeyDictionary()


def limiter_for(redis: Any, namespace: str = DEFAULT_NAMESPACE) -> Limiter:
    """One ``Limiter`` per client and namespace (its scripts are registered once)."""
    per_client = _limiters.setdefault(redis, {})
    if namespace not in per_client:
        per_client[namespace] = Limiter(redis, namespace)
    return per_client[namespace]


def estimate_tokens(text_bytes: int, max_tokens: int = 0, n: int = 1) -> int:
    """What a call may cost before it runs: its input's tokens (``cost.estimate_tokens``, the
    estimate fair shares use), plus the completion tokens it may generate (``max_tokens`` per
    choice)."""
    return cost.estimate_tokens(text_bytes) + max(0, max_tokens) * max(1, n)


def ttl_for(timeout_s: float) -> float:
    """How long an admission holds its reservation: the call's wait plus ``TTL_MARGIN_S``."""
    return max(0.0, timeout_s) + TTL_MARGIN_S


async def admit_call(redis: Any, principal: Principal, ids: Sequence[str], *,
                     estimate: int, payload_bytes: int, ttl_s: float,
                     namespace: str = DEFAULT_NAMESPACE) -> dict[str, str]:
    """Admit a call of ``ids`` (stored ids): the headers for its response, or ``ApiError``
    429 naming the limit that refused it. No Redis call for a key without limits."""
    if principal.tenant is None or not principal.limited:
        return {}
    admission = await limiter_for(redis, namespace).admit(
        principal, ids, estimate, payload_bytes, ttl_s)
    headers = rate_limit_headers(admission)
    if not admission.admitted:
        raise ApiError(429, "rate_limit_error", admission.limit or "rate_limit_exceeded",
                       admission.message, headers=headers)
    return headers


async def settle_results(redis: Any, principal: Principal, results: Iterable[Result], *,
                         namespace: str = DEFAULT_NAMESPACE) -> int:
    """Settle each result's reservation on its actual tokens; the ids settled (each id at
    most once, however often this is called)."""
    if principal.tenant is None or not principal.limited:
        return 0
    return await limiter_for(redis, namespace).settle(
        principal, [(r.id, actual_tokens(r)) for r in results])


async def release(redis: Any, principal: Principal, ids: Iterable[str], *,
                  namespace: str = DEFAULT_NAMESPACE) -> int:
    """Give back all that ``ids`` reserved (they were not queued after all)."""
    if principal.tenant is None or not principal.limited:
        return 0
    return await limiter_for(redis, namespace).settle(principal, [(i, 0) for i in ids])


class Reservation:
    """One call's admission: its reservation ids (stored request ids, or ids of the call's
    own for inputs whose request ids are made later), the headers for its response, and
    how it settles. Free for a caller without limits (no Redis call anywhere)."""

    __slots__ = ("headers", "ids", "namespace", "principal", "redis")

    def __init__(self, redis: Any, principal: Principal, ids: Sequence[str],
                 headers: dict[str, str], namespace: str) -> None:
        self.redis = redis
        self.principal = principal
        self.ids = list(ids)
        self.headers = headers
        self.namespace = namespace

    @property
    def active(self) -> bool:
        return self.principal.tenant is not None and self.principal.limited

    async def settle(self, results: Sequence[Result]) -> None:
        """Settle reservation i on result i's actual tokens, on the tenant's next admission
        (``Limiter.settle_soon``: no round trip of its own under load); nothing for a key
        whose reservations hold nothing to give back (``Principal.settles``)."""
        if self.active and self.principal.settles:
            limiter_for(self.redis, self.namespace).settle_soon(
                self.principal, [(i, actual_tokens(r)) for i, r in zip(self.ids, results,
                                                                        strict=True)])

    async def release(self) -> None:
        if self.active:
            await release(self.redis, self.principal, self.ids, namespace=self.namespace)


async def settle_from(handle: Any, reservation: Reservation) -> None:
    """Settle a one-request reservation on the request's result, if it has one (a request
    still running keeps its reservation until ``ttl_s``); shielded, and never raises: the
    call's own answer matters more than its accounting."""
    if not reservation.active or not reservation.principal.settles or not reservation.ids:
        return
    with anyio.CancelScope(shield=True):
        try:
            result = await handle.peek()
            if result is not None:
                await reservation.settle([result])
        except Exception as exc:  # accounting never fails a call
            log.warning("could not settle the reservation of %s: %s", handle.id, exc)


async def reserve(redis: Any, principal: Principal, ids: Sequence[str], *, text_bytes: int,
                  timeout_s: float, max_tokens: int = 0, n: int = 1,
                  namespace: str = DEFAULT_NAMESPACE) -> Reservation:
    """Admit a call (``admit_call``) and return its reservation; 429 ``ApiError`` if refused."""
    headers = await admit_call(redis, principal, ids,
                               estimate=estimate_tokens(text_bytes, max_tokens, n),
                               payload_bytes=text_bytes, ttl_s=ttl_for(timeout_s),
                               namespace=namespace)
    return Reservation(redis, principal, ids, headers, namespace)
