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

import math
from collections.abc import Iterable, Mapping

#: The enqueue outcome of a request admission refused: ``late:<predicted ms>``.
LATE = "late:"


def policy(order: str, rate: float | None) -> str:
    """The enqueue script's policy argument: the order, then the service rate (requests per
    second of this shard) when admission is by prediction and a rate is known."""
    if rate is None or not rate > 0 or not math.isfinite(rate):
        return order
    return f"{order} {rate:.6g}"


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
