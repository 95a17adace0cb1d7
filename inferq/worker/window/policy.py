"""Adaptive batching window: when should a worker release the batch it holds?

The worker claims requests one (or a few) at a time and keeps them in a batch
until this policy says "release". Releasing early keeps latency low for what is
in hand; waiting lets the model amortise its fixed per-batch cost over more
requests. The policy balances the two from two online estimates:

* :class:`LatencyModel` -- batch latency fitted as ``a*n + b`` seconds
  (``a`` = marginal cost per request, ``b`` = fixed cost per batch);
* :class:`ArrivalRate` -- requests per second, so ``g = 1/rate`` is the
  expected gap until the next arrival.

The pay rule
------------
Holding ``n`` requests, compare "dispatch now" with "wait for exactly one more
arrival, then dispatch ``n + 1``", summing latency over the ``n`` requests in
hand plus the newcomer:

* Waiting costs each request in hand the gap ``g`` plus the extra marginal cost
  ``a`` of a bigger batch: ``n*(g + a)`` in total.
* Waiting saves the newcomer a batch of its own. Dispatched now, the current
  batch takes ``a*n + b``; the newcomer arrives ``g`` into it, waits for it to
  finish and then runs alone (``a + b``), so its latency is
  ``a*n + 2b + a - g``. Batched with the others it sees ``a*(n + 1) + b``.
  The saving is ``b - g``.

So waiting pays iff ``n*(g + a) < b - g``, i.e.::

    (n + 1)*g + n*a < b

When ``g >= a*n + b`` (the newcomer would arrive after the current batch is
already done) the newcomer's saving vanishes, and the inequality above is then
false anyway, so the rule needs no special case: waiting never pays once the
expected gap is as large as the predicted batch latency. The left-hand side
grows with ``n``, so the rule gathers a batch up to the size where one more
arrival is no longer worth its delay -- a small batch under a trickle, a large
one under load, none at all (``WINDOW``) when arrivals are too sparse.

The rule is myopic (one arrival ahead) and is bounded by hard limits, checked
first and in this order: ``FULL`` (max batch size), ``BUDGET`` (max tokens),
``MAX_WAIT`` (the oldest request has waited ``max_wait_s``) and ``DEADLINE``
(waiting any longer would make the earliest deadline miss, with a safety
``deadline_margin`` on the predicted latency).

Until the latency model has seen a batch, the rule uses ``a = 0`` and
``b = max_wait_s``: optimistic, so a cold worker gathers (still bounded by
``max_wait_s``) rather than dispatching batches of one while it learns.

Nothing here reads a clock: every time-dependent call takes ``now`` (seconds on
the caller's monotonic clock), which keeps the policy deterministic and
testable with a fake clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

# Below this (weighted) variance of observed batch sizes a slope cannot be
# estimated; batch sizes are integers, so any real spread is far above it.
_MIN_SIZE_VARIANCE = 1e-3

# Shortest observation span the arrival estimator divides by: a burst recorded
# at the very instant observation started would otherwise read as infinite.
_MIN_SPAN_S = 1e-4

# Shortest wait the policy suggests while gathering, so a caller is not asked
# to spin on sub-microsecond sleeps under very high arrival rates.
_MIN_WAIT_S = 0.0005


def _finite_float(value: object) -> float | None:
    """``value`` as a finite float, or None for anything else (bools, NaN, text...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


class LatencyModel:
    """Online fit of batch latency ``seconds ~ a*n + b``.

    Weighted least squares with exponential forgetting: before each new
    observation all previous weights are multiplied by ``decay``, so the fit
    follows a latency that drifts (thermal throttling, a model swap, a
    co-tenant) with an effective memory of about ``1 / (1 - decay)`` batches.

    The sufficient statistics are kept as weighted means and co-moments
    (West's incremental algorithm) rather than raw sums, which keeps the fit
    exact to rounding even when the sizes' mean is large relative to their
    spread.
    """

    __slots__ = ("_c_nn", "_c_ny", "_coef", "_decay", "_mean_n", "_mean_y", "_samples", "_w")

    def __init__(self, decay: float = 0.95) -> None:
        if not (0.0 < decay <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self._decay = float(decay)
        self._samples = 0
        self._w = 0.0
        self._mean_n = 0.0
        self._mean_y = 0.0
        self._c_nn = 0.0
        self._c_ny = 0.0
        self._coef: tuple[float, float] | None = (0.0, 0.0)

    @property
    def decay(self) -> float:
        return self._decay

    @property
    def samples(self) -> int:
        """Number of batches observed (not weighted)."""
        return self._samples

    @property
    def fitted(self) -> bool:
        return self._samples > 0

    @property
    def a(self) -> float:
        """Marginal seconds per request in a batch (>= 0)."""
        return self._coefficients()[0]

    @property
    def b(self) -> float:
        """Fixed seconds per batch (>= 0)."""
        return self._coefficients()[1]

    def predict(self, n: float) -> float:
        """Predicted latency in seconds of a batch of ``n`` requests (0 before any observation)."""
        a, b = self._coefficients()
        return a * n + b

    def observe(self, n: int, seconds: float) -> None:
        """Record that a batch of ``n`` requests took ``seconds``.

        Raises ValueError for ``n < 1`` or a negative / non-finite duration:
        those are caller bugs, and fitting them would poison the model.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        x = float(n)
        y = float(seconds)
        # Forget: scale all previous weights (means are unchanged by scaling).
        self._w *= self._decay
        self._c_nn *= self._decay
        self._c_ny *= self._decay
        # Add the new point with weight 1.
        self._w += 1.0
        dx = x - self._mean_n
        self._mean_n += dx / self._w
        self._mean_y += (y - self._mean_y) / self._w
        self._c_nn += dx * (x - self._mean_n)
        self._c_ny += dx * (y - self._mean_y)
        self._samples += 1
        self._coef = None

    def _coefficients(self) -> tuple[float, float]:
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, float]:
        if self._samples == 0 or self._w <= 0.0:
            return (0.0, 0.0)
        mean_n = self._mean_n
        mean_y = max(self._mean_y, 0.0)
        var_n = self._c_nn / self._w
        if var_n < _MIN_SIZE_VARIANCE:
            # One batch size only: the split between a and b is unidentifiable.
            # Assume latency proportional to (n + 1) -- half fixed cost at n=1.
            s = mean_y / (mean_n + 1.0)
            return (s, s)
        a = self._c_ny / self._c_nn
        b = mean_y - a * mean_n
        if a < 0.0:
            # Latency falling with size is noise; the best flat fit is the mean.
            return (0.0, mean_y)
        if b < 0.0:
            # Best fit through the origin: a = E[n*y] / E[n^2].
            e_ny = self._c_ny / self._w + mean_n * mean_y
            e_nn = var_n + mean_n * mean_n
            return (max(e_ny / e_nn, 0.0), 0.0)
        return (a, b)

    def to_state(self) -> dict[str, float]:
        """Plain floats, safe for JSON or msgpack."""
        return {
            "decay": self._decay,
            "samples": float(self._samples),
            "w": self._w,
            "mean_n": self._mean_n,
            "mean_y": self._mean_y,
            "c_nn": self._c_nn,
            "c_ny": self._c_ny,
        }

    @classmethod
    def from_state(cls, state: object) -> LatencyModel:
        """Rebuild from :meth:`to_state`; anything missing or invalid gives a fresh model.

        Never raises: a corrupt persisted state must not stop a worker from
        starting, it only costs it the tuning.
        """
        if not isinstance(state, Mapping):
            return cls()
        values: dict[str, float] = {}
        for key in ("decay", "samples", "w", "mean_n", "mean_y", "c_nn", "c_ny"):
            value = _finite_float(state.get(key))
            if value is None:
                return cls()
            values[key] = value
        decay = values["decay"]
        if not (0.0 < decay <= 1.0):
            return cls()
        model = cls(decay)
        samples = values["samples"]
        if (
            samples < 1.0
            or samples != math.floor(samples)
            or values["w"] <= 0.0
            or values["mean_n"] < 1.0
            or values["mean_y"] < 0.0
            or values["c_nn"] < 0.0
        ):
            return model
        model._samples = int(samples)
        model._w = values["w"]
        model._mean_n = values["mean_n"]
        model._mean_y = values["mean_y"]
        model._c_nn = values["c_nn"]
        model._c_ny = values["c_ny"]
        model._coef = None
        return model


class ArrivalRate:
    """Arrivals per second, exponentially decaying with time constant ``tau_s``.

    Each arrival adds ``1/tau_s`` to a level that decays as
    ``exp(-elapsed/tau_s)``; for a steady stream the level settles at the
    arrival rate, and with no arrivals it decays toward 0, so ``rate(now)``
    reflects the time since the last arrival.

    Warm-up is bias-corrected (as in Adam's moment estimates): the level is
    divided by the fraction of the exponential window that has actually been
    observed, so a fresh estimator reads about ``k / elapsed`` after ``k``
    arrivals instead of climbing slowly from 0 over several ``tau_s``. The
    very first arrival only starts the observation clock -- a rate needs an
    interval -- so a fresh estimator reads 0 until its second arrival.

    Timestamps come from the caller's monotonic clock, which does not survive a
    restart, so persisted state keeps only the rate. A restored estimator
    re-anchors its clock at the first ``record``/``rate`` call and decays from
    there.
    """

    __slots__ = ("_last", "_level", "_tau", "_weight")

    def __init__(self, tau_s: float = 2.0) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0.0):
            raise ValueError(f"tau_s must be finite and > 0, got {tau_s!r}")
        self._tau = float(tau_s)
        # Decayed arrival count / tau, as of time _last (not bias-corrected).
        self._level = 0.0
        # Fraction of the exponential window observed, as of _last (0..1).
        self._weight = 0.0
        # Time of the last update; None before the first one (fresh or restored).
        self._last: float | None = None

    @property
    def tau_s(self) -> float:
        return self._tau

    def _advance(self, t: float) -> None:
        """Decay the level and grow the observed weight from ``_last`` to ``t``."""
        if self._last is None:
            self._last = t
            return
        dt = t - self._last
        if dt <= 0.0:
            return  # never move backwards; late timestamps count as "now"
        e = math.exp(-dt / self._tau)
        self._level *= e
        # weight(t) = 1 - (1 - weight)*e, written to stay exact for small dt.
        self._weight = self._weight * e - math.expm1(-dt / self._tau)
        self._last = t

    def record(self, t: float, count: int = 1) -> None:
        """Record ``count`` arrivals at time ``t``."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        if count == 0:
            return
        if self._last is None and self._weight == 0.0:
            # Fresh: this arrival starts the observation window.
            self._last = t
            return
        self._advance(t)
        self._level += count / self._tau

    def record_each(self, times: Iterable[float]) -> None:
        """``record(t)`` for each of ``times``, in order, in one call (a claimed window's
        arrivals): the same arithmetic, without three calls per arrival."""
        tau, last, level, weight = self._tau, self._last, self._level, self._weight
        exp, expm1 = math.exp, math.expm1
        for t in times:
            if last is None:  # fresh or restored: this arrival (re)starts the clock
                fresh = weight == 0.0
                last = t
                if fresh:
                    continue
            else:
                dt = t - last
                if dt > 0.0:
                    e = exp(-dt / tau)
                    level *= e
                    weight = weight * e - expm1(-dt / tau)
                    last = t
            level += 1 / tau
        self._last, self._level, self._weight = last, level, weight

    def rate(self, now: float) -> float:
        """Estimated arrivals per second at ``now``."""
        if self._last is None:
            if self._weight == 0.0:
                return 0.0
            self._last = now  # restored: anchor the clock here
        dt = max(now - self._last, 0.0)
        e = math.exp(-dt / self._tau)
        weight = self._weight * e - math.expm1(-dt / self._tau)
        weight = max(weight, -math.expm1(-_MIN_SPAN_S / self._tau))
        return self._level * e / weight

    def expected_gap(self, now: float) -> float:
        """Expected seconds until the next arrival (``math.inf`` when the rate is 0)."""
        r = self.rate(now)
        return 1.0 / r if r > 0.0 else math.inf

    def to_state(self) -> dict[str, float]:
        """The rate as of the last arrival, plus the observed window fraction."""
        if self._weight <= 0.0:
            return {"tau_s": self._tau, "rate": 0.0, "weight": 0.0}
        weight = max(self._weight, -math.expm1(-_MIN_SPAN_S / self._tau))
        return {"tau_s": self._tau, "rate": self._level / weight, "weight": self._weight}

    @classmethod
    def from_state(cls, state: object) -> ArrivalRate:
        """Rebuild from :meth:`to_state`; never raises (bad state gives a fresh estimator).

        ``weight`` is optional (default 1: a fully warmed rate).
        """
        if not isinstance(state, Mapping):
            return cls()
        tau = _finite_float(state.get("tau_s"))
        rate = _finite_float(state.get("rate"))
        weight = _finite_float(state.get("weight", 1.0))
        if tau is None or tau <= 0.0:
            return cls()
        estimator = cls(tau)
        if rate is None or rate <= 0.0 or weight is None or not (0.0 < weight <= 1.0):
            return estimator
        estimator._weight = weight
        estimator._level = rate * max(weight, -math.expm1(-_MIN_SPAN_S / tau))
        return estimator


class ReleaseReason(StrEnum):
    FULL = "full"
    """The batch reached ``max_batch_size``."""
    BUDGET = "budget"
    """The batch reached ``max_batch_tokens``."""
    DEADLINE = "deadline"
    """Waiting any longer would make the earliest deadline miss."""
    MAX_WAIT = "max_wait"
    """The oldest request has waited ``max_wait_s``."""
    WINDOW = "window"
    """Waiting for more arrivals no longer pays (see the module docstring)."""
    WAIT = "wait"
    """Not released: wait ``wait_s`` for more arrivals, then decide again."""


@dataclass(frozen=True, slots=True)
class Decision:
    release: bool
    reason: ReleaseReason
    wait_s: float
    """When not released: how long to wait for arrivals before deciding again (> 0)."""


@dataclass(frozen=True, slots=True)
class WindowConfig:
    max_batch_size: int
    max_batch_tokens: int | None
    max_wait_s: float
    deadline_margin: float = 1.2
    """Safety factor on predicted latency when checking deadlines."""

    def __post_init__(self) -> None:
        size = self.max_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {size!r}")
        tokens = self.max_batch_tokens
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
        ):
            raise ValueError(f"max_batch_tokens must be None or an int >= 1, got {tokens!r}")
        wait = _finite_float(self.max_wait_s)
        if wait is None or wait < 0.0:
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s!r}")
        margin = _finite_float(self.deadline_margin)
        if margin is None or margin <= 0.0:
            raise ValueError(
                f"deadline_margin must be a finite number > 0, got {self.deadline_margin!r}"
            )


class WindowPolicy:
    """Decides when a gathering batch is released; see the module docstring."""

    __slots__ = ("_arrivals", "_config", "_latency")

    def __init__(
        self,
        config: WindowConfig,
        *,
        latency: LatencyModel | None = None,
        arrivals: ArrivalRate | None = None,
    ) -> None:
        self._config = config
        self._latency = latency if latency is not None else LatencyModel()
        self._arrivals = arrivals if arrivals is not None else ArrivalRate()

    @property
    def config(self) -> WindowConfig:
        return self._config

    @property
    def latency(self) -> LatencyModel:
        return self._latency

    @property
    def arrivals(self) -> ArrivalRate:
        return self._arrivals

    def observe_batch(self, n: int, seconds: float) -> None:
        """Feed a finished batch's size and latency to the latency model."""
        self._latency.observe(n, seconds)

    def record_arrivals(self, t: float, count: int = 1) -> None:
        """Feed ``count`` arrivals at time ``t`` to the arrival-rate estimate."""
        self._arrivals.record(t, count)

    def record_each_arrival(self, times: Iterable[float]) -> None:
        """One arrival at each of ``times``, in order (``record_arrivals(t, 1)`` for each)."""
        self._arrivals.record_each(times)

    def _cost_coefficients(self) -> tuple[float, float]:
        """(a, b) for the pay rule; optimistic (0, max_wait_s) until fitted."""
        if not self._latency.fitted:
            return (0.0, self._config.max_wait_s)
        return (self._latency.a, self._latency.b)

    @staticmethod
    def _waiting_pays(n: int, gap: float, a: float, b: float) -> bool:
        return (n + 1) * gap + n * a < b

    def decide(
        self,
        now: float,
        *,
        size: int,
        tokens: int,
        oldest_arrival: float,
        earliest_deadline: float | None,
    ) -> Decision:
        """Release the batch now, or say how long to wait for more arrivals.

        ``size``/``tokens`` describe the batch in hand, ``oldest_arrival`` is
        when its oldest request arrived and ``earliest_deadline`` the tightest
        deadline among its requests (None if none has one), all on the same
        clock as ``now``.
        """
        cfg = self._config
        if size <= 0:
            # Nothing to release; the caller blocks for work instead.
            return Decision(False, ReleaseReason.WAIT, cfg.max_wait_s)
        if size >= cfg.max_batch_size:
            return Decision(True, ReleaseReason.FULL, 0.0)
        if cfg.max_batch_tokens is not None and tokens >= cfg.max_batch_tokens:
            return Decision(True, ReleaseReason.BUDGET, 0.0)
        wait_bound = oldest_arrival + cfg.max_wait_s
        if now >= wait_bound:
            return Decision(True, ReleaseReason.MAX_WAIT, 0.0)
        deadline_bound = math.inf
        if earliest_deadline is not None:
            # Latest moment at which a batch grown by one more request still
            # finishes, with margin, before the earliest deadline.
            deadline_bound = (
                earliest_deadline - self._latency.predict(size + 1) * cfg.deadline_margin
            )
            if now >= deadline_bound:
                return Decision(True, ReleaseReason.DEADLINE, 0.0)
        gap = self._arrivals.expected_gap(now)
        if math.isinf(gap):
            return Decision(True, ReleaseReason.WINDOW, 0.0)
        a, b = self._cost_coefficients()
        if not self._waiting_pays(size, gap, a, b):
            return Decision(True, ReleaseReason.WINDOW, 0.0)
        wait_s = min(wait_bound - now, deadline_bound - now, max(2.0 * gap, _MIN_WAIT_S))
        return Decision(False, ReleaseReason.WAIT, wait_s)

    def _simulate(self, now: float) -> tuple[float, int]:
        """(window seconds, batch size) for a batch starting with one request at
        ``now``, if arrivals keep coming every ``1/rate(now)`` seconds."""
        cfg = self._config
        gap = self._arrivals.expected_gap(now)
        if math.isinf(gap):
            return (0.0, 1)
        a, b = self._cost_coefficients()
        elapsed = 0.0
        k = 1
        while k < cfg.max_batch_size and elapsed < cfg.max_wait_s:
            if not self._waiting_pays(k, gap, a, b):
                break
            if elapsed + gap > cfg.max_wait_s:
                # The next arrival would come after the bound: held to the bound.
                return (cfg.max_wait_s, k)
            elapsed += gap
            k += 1
        return (min(elapsed, cfg.max_wait_s), k)

    def window_s(self, now: float) -> float:
        """The current adaptive window: how long a batch starting now with one
        request would be held open at the current arrival rate (for metrics)."""
        return self._simulate(now)[0]

    def target_batch_size(self, now: float) -> int:
        """The batch size the current window would gather (for metrics)."""
        return self._simulate(now)[1]

    def to_state(self) -> dict[str, object]:
        """Latency fit and arrival rate, as plain JSON/msgpack-friendly data."""
        return {"latency": self._latency.to_state(), "arrivals": self._arrivals.to_state()}

    @classmethod
    def from_state(cls, config: WindowConfig, state: object) -> WindowPolicy:
        """Rebuild a tuned policy from :meth:`to_state`; never raises on bad state.

        Each part that is missing or invalid starts fresh on its own.
        """
        latency_state: object = None
        arrivals_state: object = None
        if isinstance(state, Mapping):
            latency_state = state.get("latency")
            arrivals_state = state.get("arrivals")
        return cls(
            config,
            latency=LatencyModel.from_state(latency_state),
            arrivals=ArrivalRate.from_state(arrivals_state),
        )
