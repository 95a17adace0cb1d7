"""A batch's lines under its owner's per-tenant limits (``inferq.tenancy.limits``): the same
buckets, in-flight count and byte budget as the tenant's online calls, so the two share them.

The creating key's limits travel with the batch (``BatchField.LIMITS``, like its priority
ceiling), whichever gateway runs it. A batch is asynchronous, so a line over a limit is not
refused: ``admit_lines`` admits the longest run of the next lines that fits (one script call
when all fit, two or three when not), and says how long to wait before the rest may be tried
(the script's retry-after for the first line left). Only a line that can never fit (more
tokens than the key's tokens per minute, more bytes than its byte budget) fails, alone, with
the 429 the online endpoint would answer. Each line's reservation is settled on its result
when the runner drains it (``Limiter.settle``, ``actual_tokens``), and released when a cancel
withdraws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferq.batch.fields import BatchField as B
from inferq.openai.errors import ApiError
from inferq.protocol.ops import EnqueueItem
from inferq.tenancy.limits import Admission, Limiter
from inferq.tenancy.principal import Principal


def limits_field(caller: Principal) -> str:
    """The ``BatchField.LIMITS`` value of a batch ``caller`` creates."""
    return " ".join(str(v or 0) for v in (caller.requests_per_minute, caller.tokens_per_minute,
                                          caller.max_in_flight, caller.max_queued_bytes))


def owner_principal(h: dict[str, str]) -> Principal:
    """The batch's owner as a principal: its tenant (the name space of its lines' ids) and
    the creating key's limits (none for a batch of the operator's, or one made before
    batches carried them)."""
    tenant = h.get(B.OWNER) or None
    raw = (h.get(B.LIMITS) or "").split()
    if tenant is None or len(raw) != 4 or not all(v.isdigit() for v in raw):
        return Principal(tenant=tenant)
    rpm, tpm, flight, size = (int(v) or None for v in raw)
    return Principal(tenant=tenant, requests_per_minute=rpm, tokens_per_minute=tpm,
                     max_in_flight=flight, max_queued_bytes=size)


@dataclass(frozen=True, slots=True)
class Admitted:
    """What ``admit_lines`` decided for the items it was given, in order."""

    #: The first ``count`` items are admitted (reserved): queue them.
    count: int
    #: When ``count`` is less than all: ms to wait before the next try (0: try again now).
    wait_ms: int = 0
    #: The item at ``count`` can never be admitted: its error (the line fails alone).
    too_large: ApiError | None = None


def _cost(item: EnqueueItem) -> tuple[int, int]:
    """A line's reservation: its token estimate (the fair-share cost: input tokens, plus
    ``max_tokens`` for a generation) and its payload's bytes."""
    return item.cost, len(item.payload)


def _fits(principal: Principal, refused: Admission, costs: Sequence[tuple[int, int]]) -> int:
    """How many of the first lines the state a refusal reported has room for."""
    fit, tokens, size = 0, 0, 0
    for t, b in costs:
        tokens, size = tokens + t, size + b
        if principal.requests_per_minute is not None and fit + 1 > refused.requests_remaining:
            break
        if principal.tokens_per_minute is not None and tokens > refused.tokens_remaining:
            break
        if principal.max_in_flight is not None and \
                refused.in_flight + fit + 1 > principal.max_in_flight:
            break
        if principal.max_queued_bytes is not None and \
                refused.queued_bytes + size > principal.max_queued_bytes:
            break
        fit += 1
    return fit


def _never_fits(principal: Principal, tokens: int, size: int) -> ApiError | None:
    if principal.tokens_per_minute is not None and tokens > principal.tokens_per_minute:
        return ApiError(429, "rate_limit_error", "tokens",
                        f"request too large: about {tokens} tokens is more than this key's "
                        f"tokens per minute ({principal.tokens_per_minute})")
    if principal.max_queued_bytes is not None and size > principal.max_queued_bytes:
        return ApiError(429, "rate_limit_error", "queued_bytes",
                        f"request too large: {size} bytes is more than this key's queued "
                        f"bytes ({principal.max_queued_bytes})")
    return None


async def admit_lines(limiter: Limiter, principal: Principal, items: Sequence[EnqueueItem],
                      ttl_s: float) -> Admitted:
    """Reserve the longest run of ``items`` (from the first) that the owner's limits admit
    now, each for at most ``ttl_s`` seconds."""
    if not items or principal.tenant is None or not principal.limited:
        return Admitted(len(items))
    costs = [_cost(item) for item in items]
    first = await limiter.admit(principal, [i.id for i in items], sum(t for t, _ in costs),
                                sum(b for _, b in costs), ttl_s)
    if first.admitted:
        return Admitted(len(items))
    error = _never_fits(principal, *costs[0])
    if error is not None:
        return Admitted(0, too_large=error)
    fit = max(1, _fits(principal, first, costs))  # none: ask for one, to learn its wait
    again = await limiter.admit(principal, [i.id for i in items[:fit]],
                                sum(t for t, _ in costs[:fit]), sum(b for _, b in costs[:fit]),
                                ttl_s)
    if again.admitted:
        return Admitted(fit)
    return Admitted(0, wait_ms=again.retry_after_ms)
