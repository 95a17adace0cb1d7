"""Latency objectives: a request's ``ttft_slo_ms``, the queue's order and admission policy as
the enqueue script takes them, and whether a result met its objective.

A request's objective is the time, from enqueue, by which its first token (``generate``) or
its result (every other task) should arrive. It is stored in the payload; the worker that
writes the result sets ``Result.slo_met`` (``met``). A queue's ``order`` (``inferq queue
set --order``) and ``admission`` (``--admission``) reach the enqueue script as its policy
argument (``policy``): ``deadline`` scores requests with an objective by their absolute
deadline (``scores``: earliest first, before those without one); ``predicted`` admission
passes the shard's service rate, and the script refuses (``late:<ms>``) a request whose
predicted time to its result, ``(ahead + 1) / rate``, passes its objective (``ahead``: the
shard's requests under lease, running or claimed into a worker's next window, and those
pending with a lower score, i.e. its band's ahead of it and every higher band's).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from inferq.protocol.settings import QueueSettings

#: The enqueue outcome of a request admission refused: ``late:<predicted ms>``.
LATE = "late:"
#: The enqueue outcome of a request its band's bound on queued tokens refused.
TOKENS_FULL = "tokens_full"


def policy(order: str, rate: float | None, max_queued_tokens: int | None = None,
           tokens: TokenService | None = None) -> str:
    """The enqueue script's policy argument: the order, then the service rate (requests per
    second of this shard) when admission is by prediction and a rate is known, then ``q`` and
    the shard's bound on the estimated tokens pending per band (``--max-queued-tokens``),
    then, for a ``generate`` queue's admission in tokens, ``t<decode tokens/s>:<slots>`` of
    this shard (``TokenService``)."""
    text = order
    if rate is not None and rate > 0 and math.isfinite(rate):
        text += f" {rate:.6g}"
    if max_queued_tokens:
        text += f" q{max_queued_tokens}"
    if tokens is not None and tokens.decode_per_s > 0 and math.isfinite(tokens.decode_per_s):
        text += f" t{tokens.decode_per_s:.6g}:{max(tokens.slots, 1)}"
    return text


def queue_policy(settings: QueueSettings) -> str:
    """``policy`` of a queue's settings, per shard: the fleet's rate and the bound on queued
    tokens are split evenly over the shards."""
    shards = settings.claim_shards
    rate = None if settings.service_rate is None else settings.service_rate / shards
    bound = settings.max_queued_tokens
    tokens = settings.token_service
    if tokens is not None and shards > 1:
        tokens = TokenService(tokens.decode_per_s / shards, math.ceil(tokens.slots / shards),
                              tokens.prefill_per_s)
    return policy(settings.order, rate,
                  None if bound is None else math.ceil(bound / max(settings.shards, 1)), tokens)


def max_queued_tokens(policy_text: str) -> int:
    """The bound on queued tokens a ``policy`` carries (0: none)."""
    for word in policy_text.split()[1:]:
        if word.startswith("q") and word[1:].isdigit():
            return int(word[1:])
    return 0


def late_ms(outcome: str) -> int | None:
    """The predicted ms of a ``late:<ms>`` outcome; None for any other outcome."""
    if not outcome.startswith(LATE):
        return None
    return int(outcome[len(LATE):])


def met(slo_ms: int | None, enqueued_ms: int | None, finished_ms: int | None,
        ttft_ms: float | None = None, ok: bool = True) -> bool | None:
    """Whether a request met its objective: its first token (``ttft_ms``, when it has one)
    or its result arrived within ``slo_ms`` of its enqueue; a request that did not succeed did
    not. None without an objective or without the times."""
    if slo_ms is None:
        return None
    if not ok:
        return False
    if ttft_ms is not None:
        return ttft_ms <= slo_ms
    if enqueued_ms is None or finished_ms is None:
        return None
    return finished_ms - enqueued_ms <= slo_ms


def fleet_rate(windows: Iterable[Mapping[str, str]]) -> float | None:
    """Requests per second the live workers serve at full batches, from what each publishes
    (its fitted batch latency ``a·n + b`` and batch limit ``N``: ``N / (a·N + b)``); None when
    no worker has a fit yet."""
    total, fitted = 0.0, False
    for w in windows:
        try:
            a, b = float(w["latency_a_ms"]) / 1e3, float(w["latency_b_ms"]) / 1e3
            limit, batches = int(w.get("batch_limit", "1")), int(w.get("batches", "0"))
        except (KeyError, TypeError, ValueError):
            continue
        latency = a * limit + b
        if batches > 0 and a >= 0 and b >= 0 and latency > 0 and limit >= 1:
            total += limit / latency
            fitted = True
    return total if fitted else None


#: Upper bounds of the buckets the prediction's error (actual / predicted time to the result
#: or first token) is counted in, by the workers' histogram and what they publish (one more
#: bucket: above the last).
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def prediction_ratio(predicted_ms: int, enqueued_ms: int | None, finished_ms: int | None,
                     ttft_ms: float | None = None) -> float | None:
    """The actual time to the first token (``ttft_ms``, when it has one) or the result, from
    enqueue, over the time admission predicted; None without a prediction or the times."""
    if predicted_ms <= 0:
        return None
    if ttft_ms is not None:
        return ttft_ms / predicted_ms
    if enqueued_ms is None or finished_ms is None:
        return None
    return max(finished_ms - enqueued_ms, 0) / predicted_ms


def ratio_bucket(ratio: float) -> int:
    """The index of the bucket ``ratio`` is counted in (``len(RATIO_BUCKETS)``: above all)."""
    for index, bound in enumerate(RATIO_BUCKETS):
        if ratio <= bound:
            return index
    return len(RATIO_BUCKETS)


def ratio_quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of the ratios counted in ``counts`` (one per bucket), interpolated
    inside its bucket as Prometheus' ``histogram_quantile`` does: the last finite bound for
    the bucket above it; None when nothing was counted."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen = q * total, 0
    for index, n in enumerate(counts):
        if n and seen + n >= rank:
            if index >= len(RATIO_BUCKETS):
                return RATIO_BUCKETS[-1]
            low = RATIO_BUCKETS[index - 1] if index else 0.0
            return low + (RATIO_BUCKETS[index] - low) * (rank - seen) / n
        seen += n
    return RATIO_BUCKETS[-1]


def ratio_counts(text: str) -> list[int]:
    """The bucket counts a worker publishes (``slo_ratio``: space-separated), or zeros for text
    that is not that."""
    try:
        counts = [int(x) for x in str(text).split()]
    except ValueError:
        counts = []
    return counts if len(counts) == len(RATIO_BUCKETS) + 1 else [0] * (len(RATIO_BUCKETS) + 1)


@dataclass(frozen=True, slots=True)
class TokenService:
    """What the live ``generate`` workers of a queue publish, summed: the tokens a second they
    decode with every slot busy (each worker's fitted step time ``a·S + b`` at its ``S``
    slots: ``S / (a·S + b)``), their slots, and the prompt tokens a second they prefill
    (None before any was measured)."""

    decode_per_s: float
    slots: int
    prefill_per_s: float | None = None


def fleet_tokens(workers: Iterable[Mapping[str, str]]) -> TokenService | None:
    """``TokenService`` of the continuous-batching workers among ``workers`` (their published
    fields); None when none has a decode fit and a slot count yet."""
    rate, slots, prefill, fitted = 0.0, 0, 0.0, False
    for w in workers:
        if w.get("mode") != "continuous":
            continue
        try:
            a, b = float(w["decode_a_ms"]) / 1e3, float(w["decode_b_ms"]) / 1e3
            n = int(w["max_slots"])
        except (KeyError, TypeError, ValueError):
            continue
        step = a * n + b
        if n >= 1 and a >= 0 and b >= 0 and step > 0 and math.isfinite(step):
            rate += n / step
            slots += n
            fitted = True
            with contextlib.suppress(TypeError, ValueError):
                prefill += max(float(w.get("prefill_tokens_per_s", 0)), 0.0)
    if not fitted:
        return None
    return TokenService(rate, slots, prefill if prefill > 0 else None)
