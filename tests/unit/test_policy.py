"""Unit tests for the adaptive batching window (inferq.worker.window.policy).

Time is a fake clock: a float the tests advance. Nothing sleeps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

from inferq.worker.window.policy import (
    ArrivalRate,
    Decision,
    LatencyModel,
    ReleaseReason,
    WindowConfig,
    WindowPolicy,
)

T0 = 1000.0  # an arbitrary monotonic-clock origin, away from 0


def fitted_model(a: float, b: float, sizes: range = range(1, 33)) -> LatencyModel:
    """A latency model fed exact ``a*n + b`` observations."""
    model = LatencyModel()
    for n in sizes:
        model.observe(n, a * n + b)
    return model


def warmed_rate(gap: float, until: float, history_s: float = 1.0) -> ArrivalRate:
    """An estimator that has seen a steady stream (one arrival per ``gap``) for
    ``history_s`` seconds, the last arrival one gap before ``until``."""
    rate = ArrivalRate()
    count = round(history_s / gap)
    for k in range(count, 0, -1):
        rate.record(until - k * gap)
    return rate


def fixed_rate(per_second: float) -> ArrivalRate:
    """An estimator that reads exactly ``per_second`` at its first use."""
    return ArrivalRate.from_state({"tau_s": 2.0, "rate": per_second, "weight": 1.0})


@dataclass
class Outcome:
    released_at: float
    size: int
    decision: Decision
    steps: int


def drive(
    policy: WindowPolicy,
    *,
    start: float,
    gap: float,
    deadline: float | None = None,
    tokens_per_request: int = 1,
    max_steps: int = 100_000,
) -> Outcome:
    """Run the batch-gathering loop as the worker does.

    Requests arrive at ``start + i*gap``. At each step: take the arrivals due,
    call decide, and if not released advance the fake clock by
    ``min(wait_s, time to next arrival)``.
    """
    now = start
    size = 0
    arrived = 0
    oldest: float | None = None
    for step in range(1, max_steps + 1):
        while start + arrived * gap <= now:
            t = start + arrived * gap
            policy.record_arrivals(t)
            arrived += 1
            size += 1
            if oldest is None:
                oldest = t
        assert oldest is not None
        decision = policy.decide(
            now,
            size=size,
            tokens=size * tokens_per_request,
            oldest_arrival=oldest,
            earliest_deadline=deadline,
        )
        if decision.release:
            return Outcome(now, size, decision, step)
        assert decision.reason is ReleaseReason.WAIT
        assert decision.wait_s > 0
        now = min(now + decision.wait_s, start + arrived * gap)
    raise AssertionError("batch never released")


# --------------------------------------------------------------------------- decide


@pytest.mark.parametrize("model", ["unfitted", "fitted"])
def test_fast_arrivals_fill_the_batch_long_before_max_wait(model: str) -> None:
    gap = 0.0001
    latency = fitted_model(a=0.0001, b=0.02) if model == "fitted" else LatencyModel()
    policy = WindowPolicy(
        WindowConfig(max_batch_size=32, max_batch_tokens=None, max_wait_s=0.050),
        latency=latency,
        arrivals=warmed_rate(gap, T0),
    )

    out = drive(policy, start=T0, gap=gap)

    assert out.decision == Decision(True, ReleaseReason.FULL, 0.0)
    assert out.size == 32
    # The 32nd request arrives 31 gaps after the first: ~3.1-3.2 ms, not 50 ms.
    assert out.released_at - T0 == pytest.approx(31 * gap, abs=1e-9)
    assert out.released_at - T0 < 0.005


def test_trickle_waits_up_to_max_wait() -> None:
    gap = 0.005
    policy = WindowPolicy(
        WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050),
        latency=fitted_model(a=0.0005, b=0.100),
        arrivals=warmed_rate(gap, T0),
    )

    out = drive(policy, start=T0, gap=gap)

    assert out.decision.reason is ReleaseReason.MAX_WAIT
    assert out.released_at - T0 == pytest.approx(0.050, abs=1e-9)
    # Arrivals at 0, 5, ..., 45 ms (and possibly the one landing exactly at 50 ms).
    assert 10 <= out.size <= 11


def test_sparse_arrivals_release_immediately() -> None:
    gap = 1.0  # far above b = 14 ms: waiting can never pay
    policy = WindowPolicy(
        WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050),
        latency=fitted_model(a=0.006, b=0.014),
        arrivals=warmed_rate(gap, T0, history_s=20.0),
    )

    out = drive(policy, start=T0, gap=gap)

    assert out.decision == Decision(True, ReleaseReason.WINDOW, 0.0)
    assert out.size == 1
    assert out.released_at == T0
    assert out.steps == 1


def test_no_arrival_history_releases_with_window() -> None:
    # A rate of 0 means an infinite expected gap: nobody else is coming.
    policy = WindowPolicy(WindowConfig(max_batch_size=8, max_batch_tokens=None, max_wait_s=0.05))
    decision = policy.decide(T0, size=1, tokens=1, oldest_arrival=T0, earliest_deadline=None)
    assert decision == Decision(True, ReleaseReason.WINDOW, 0.0)


def test_unreachable_deadline_releases_at_once() -> None:
    # Trickle setup, but the deadline is 30 ms after the first arrival while a
    # batch alone is predicted to take 100+ ms: waiting can only make it worse.
    gap = 0.005
    latency = fitted_model(a=0.0005, b=0.100)
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050)
    policy = WindowPolicy(config, latency=latency, arrivals=warmed_rate(gap, T0))
    deadline = T0 + 0.030

    out = drive(policy, start=T0, gap=gap, deadline=deadline)

    assert out.decision.reason is ReleaseReason.DEADLINE
    assert out.size == 1
    assert out.released_at == T0
    # Already too late even for a batch of one: gathering cannot help.
    assert out.released_at + latency.predict(1) > deadline


def test_deadline_caps_the_wait() -> None:
    # Trickle setup with a deadline that leaves ~30 ms of slack for gathering:
    # the batch must go out before max_wait, as late as the deadline allows.
    gap = 0.005
    latency = fitted_model(a=0.0005, b=0.100)
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050)
    policy = WindowPolicy(config, latency=latency, arrivals=warmed_rate(gap, T0))
    deadline = T0 + 0.030 + config.deadline_margin * latency.predict(8)

    out = drive(policy, start=T0, gap=gap, deadline=deadline)

    assert out.decision.reason is ReleaseReason.DEADLINE
    waited = out.released_at - T0
    assert 0.025 <= waited < 0.031
    # The released batch still finishes, with margin, before the deadline.
    assert out.released_at + config.deadline_margin * latency.predict(out.size) <= deadline + 1e-12
    # Without the deadline the same stream would have been held to max_wait.
    assert waited < config.max_wait_s


def test_wait_s_is_bounded_by_max_wait_and_deadline() -> None:
    latency = fitted_model(a=0.0005, b=0.100)
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050)

    # Gap 10 ms would suggest 20 ms, but only 3 ms remain before max_wait.
    policy = WindowPolicy(config, latency=latency, arrivals=fixed_rate(100.0))
    d = policy.decide(T0, size=2, tokens=2, oldest_arrival=T0 - 0.047, earliest_deadline=None)
    assert d.reason is ReleaseReason.WAIT
    assert d.wait_s == pytest.approx(0.003)

    # ... and 2 ms before the deadline bound.
    policy = WindowPolicy(config, latency=latency, arrivals=fixed_rate(100.0))
    deadline = T0 + 0.002 + latency.predict(3) * config.deadline_margin
    d = policy.decide(T0, size=2, tokens=2, oldest_arrival=T0, earliest_deadline=deadline)
    assert d.reason is ReleaseReason.WAIT
    assert d.wait_s == pytest.approx(0.002)

    # Otherwise two expected gaps.
    policy = WindowPolicy(config, latency=latency, arrivals=fixed_rate(100.0))
    d = policy.decide(T0, size=2, tokens=2, oldest_arrival=T0, earliest_deadline=None)
    assert d.wait_s == pytest.approx(0.020)

    # With a tiny gap, never less than 0.5 ms.
    policy = WindowPolicy(config, latency=latency, arrivals=fixed_rate(1e6))
    d = policy.decide(T0, size=2, tokens=2, oldest_arrival=T0, earliest_deadline=None)
    assert d.reason is ReleaseReason.WAIT
    assert d.wait_s == pytest.approx(0.0005)


def test_budget_releases_when_tokens_reach_the_limit() -> None:
    config = WindowConfig(max_batch_size=64, max_batch_tokens=4096, max_wait_s=0.050)
    policy = WindowPolicy(config, latency=fitted_model(0.0005, 0.1), arrivals=fixed_rate(1000.0))
    below = policy.decide(T0, size=3, tokens=4095, oldest_arrival=T0, earliest_deadline=None)
    assert not below.release
    at = policy.decide(T0, size=3, tokens=4096, oldest_arrival=T0, earliest_deadline=None)
    assert at == Decision(True, ReleaseReason.BUDGET, 0.0)
    over = policy.decide(T0, size=3, tokens=9999, oldest_arrival=T0, earliest_deadline=None)
    assert over.reason is ReleaseReason.BUDGET


def test_budget_released_through_the_worker_loop() -> None:
    gap = 0.001
    config = WindowConfig(max_batch_size=64, max_batch_tokens=1000, max_wait_s=0.050)
    policy = WindowPolicy(config, arrivals=warmed_rate(gap, T0))
    out = drive(policy, start=T0, gap=gap, tokens_per_request=100)
    assert out.decision.reason is ReleaseReason.BUDGET
    assert out.size == 10


def test_checks_run_in_order_full_budget_max_wait_deadline() -> None:
    config = WindowConfig(max_batch_size=4, max_batch_tokens=100, max_wait_s=0.050)
    policy = WindowPolicy(config, latency=fitted_model(0.0005, 0.1), arrivals=fixed_rate(1000.0))
    stale = T0 - 1.0  # max_wait long exceeded
    missed = T0 - 1.0  # deadline long missed

    def reason(size: int, tokens: int, oldest: float, deadline: float | None) -> ReleaseReason:
        d = policy.decide(
            T0, size=size, tokens=tokens, oldest_arrival=oldest, earliest_deadline=deadline
        )
        return d.reason

    assert reason(4, 100, stale, missed) is ReleaseReason.FULL
    assert reason(3, 100, stale, missed) is ReleaseReason.BUDGET
    assert reason(3, 99, stale, missed) is ReleaseReason.MAX_WAIT
    assert reason(3, 99, T0, missed) is ReleaseReason.DEADLINE
    assert reason(3, 99, T0, None) is ReleaseReason.WAIT


def test_empty_batch_is_never_released() -> None:
    config = WindowConfig(max_batch_size=1, max_batch_tokens=1, max_wait_s=0.025)
    policy = WindowPolicy(config, arrivals=fixed_rate(1000.0))
    d = policy.decide(T0, size=0, tokens=5, oldest_arrival=T0 - 9.0, earliest_deadline=T0 - 9.0)
    assert d == Decision(False, ReleaseReason.WAIT, 0.025)


@pytest.mark.parametrize(("factor", "waits"), [(0.999, True), (1.001, False)])
def test_pay_rule_boundary_fitted(factor: float, waits: bool) -> None:
    # (n+1)*g + n*a = b  at n=4, a=1 ms, b=20 ms  =>  g* = (20 - 4)/5 ms = 3.2 ms.
    a, b, n = 0.001, 0.020, 4
    g_star = (b - n * a) / (n + 1)
    gap = g_star * factor
    policy = WindowPolicy(
        WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050),
        latency=fitted_model(a, b),
        arrivals=fixed_rate(1.0 / gap),
    )
    assert policy.latency.a == pytest.approx(a, abs=1e-9)
    assert policy.latency.b == pytest.approx(b, abs=1e-9)

    d = policy.decide(T0, size=n, tokens=n, oldest_arrival=T0, earliest_deadline=None)

    if waits:
        assert d.reason is ReleaseReason.WAIT
        assert not d.release
        assert d.wait_s == pytest.approx(2 * gap)
    else:
        assert d == Decision(True, ReleaseReason.WINDOW, 0.0)


@pytest.mark.parametrize(("factor", "waits"), [(0.999, True), (1.001, False)])
def test_pay_rule_boundary_unfitted_uses_max_wait_as_b(factor: float, waits: bool) -> None:
    # Unfitted: a = 0, b = max_wait_s = 50 ms, so at n=4 the boundary is g = 10 ms.
    n = 4
    gap = 0.050 / (n + 1) * factor
    policy = WindowPolicy(
        WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050),
        arrivals=fixed_rate(1.0 / gap),
    )
    d = policy.decide(T0, size=n, tokens=n, oldest_arrival=T0, earliest_deadline=None)
    assert d.release is not waits
    assert d.reason is (ReleaseReason.WAIT if waits else ReleaseReason.WINDOW)


def test_silence_closes_the_window() -> None:
    # While gathering, if arrivals stop, the decaying rate eventually says stop.
    latency = fitted_model(a=0.0005, b=0.100)
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=10.0)
    policy = WindowPolicy(config, latency=latency, arrivals=warmed_rate(0.005, T0))
    policy.record_arrivals(T0)
    now = T0
    for _ in range(10_000):
        d = policy.decide(now, size=1, tokens=1, oldest_arrival=T0, earliest_deadline=None)
        if d.release:
            break
        now += d.wait_s
    assert d.reason is ReleaseReason.WINDOW
    # Released once the rate decayed enough that 2g >= b, long before max_wait.
    assert now - T0 < 5.0
    assert 2 * policy.arrivals.expected_gap(now) >= latency.b


# --------------------------------------------------------------------------- LatencyModel


def test_latency_model_unfitted_is_zero() -> None:
    model = LatencyModel()
    assert not model.fitted
    assert model.samples == 0
    assert (model.a, model.b) == (0.0, 0.0)
    assert model.predict(16) == 0.0


def test_latency_model_recovers_exact_coefficients() -> None:
    model = fitted_model(a=0.006, b=0.014)
    assert model.fitted
    assert model.samples == 32
    assert model.a == pytest.approx(0.006, abs=1e-6)
    assert model.b == pytest.approx(0.014, abs=1e-6)
    assert model.predict(10) == pytest.approx(0.074, abs=1e-6)


def test_latency_model_recovers_coefficients_in_any_order() -> None:
    model = LatencyModel()
    for n in [17, 3, 32, 1, 8, 8, 25, 2, 31, 16] * 5:
        model.observe(n, 0.006 * n + 0.014)
    assert model.a == pytest.approx(0.006, abs=1e-6)
    assert model.b == pytest.approx(0.014, abs=1e-6)


def test_latency_model_forgets_and_follows_a_change() -> None:
    model = fitted_model(a=0.006, b=0.014)
    for _ in range(10):  # the GPU gets twice as slow per request, fixed cost halves
        for n in range(1, 33):
            model.observe(n, 0.012 * n + 0.007)
    assert model.a == pytest.approx(0.012, rel=1e-3)
    assert model.b == pytest.approx(0.007, rel=1e-2)


def test_latency_model_without_forgetting_does_not_follow() -> None:
    # Control for the test above: decay=1 averages both regimes.
    model = LatencyModel(decay=1.0)
    for n in range(1, 33):
        model.observe(n, 0.006 * n + 0.014)
    for n in range(1, 33):
        model.observe(n, 0.012 * n + 0.007)
    assert model.a == pytest.approx(0.009, rel=1e-6)


def test_latency_model_single_size_assumes_proportional_to_n_plus_one() -> None:
    model = LatencyModel()
    for _ in range(5):
        model.observe(7, 0.080)
    assert model.a == pytest.approx(0.010)
    assert model.b == pytest.approx(0.010)
    assert model.predict(7) == pytest.approx(0.080)


def test_latency_model_coefficients_are_clamped_non_negative() -> None:
    falling = LatencyModel()
    for n in range(1, 9):
        falling.observe(n, 0.100 - 0.005 * n)  # slope < 0
    assert falling.a == 0.0
    assert falling.b > 0.0

    steep = LatencyModel()
    for n in range(10, 20):
        steep.observe(n, 0.010 * n - 0.050)  # intercept < 0
    assert steep.b == 0.0
    assert steep.a > 0.0


@pytest.mark.parametrize(("n", "seconds"), [(0, 0.1), (-1, 0.1), (1, -0.1), (1, math.nan)])
def test_latency_model_rejects_invalid_observations(n: int, seconds: float) -> None:
    model = LatencyModel()
    with pytest.raises(ValueError):
        model.observe(n, seconds)
    assert not model.fitted


def test_latency_model_state_round_trip() -> None:
    model = fitted_model(a=0.006, b=0.014, sizes=range(1, 20))
    state = json.loads(json.dumps(model.to_state()))
    assert all(isinstance(v, float) for v in state.values())
    restored = LatencyModel.from_state(state)
    assert restored.samples == model.samples
    assert (restored.a, restored.b) == (model.a, model.b)
    model.observe(40, 0.3)
    restored.observe(40, 0.3)
    assert (restored.a, restored.b) == (model.a, model.b)


_GOOD_LATENCY_STATE: dict[str, object] = {
    "decay": 0.95,
    "samples": 3.0,
    "w": 2.5,
    "mean_n": 2.0,
    "mean_y": 0.1,
    "c_nn": 1.0,
    "c_ny": 0.01,
}


def test_latency_model_good_state_is_accepted() -> None:
    # Control for the garbage cases below, which each spoil one field of this.
    model = LatencyModel.from_state(_GOOD_LATENCY_STATE)
    assert model.fitted
    assert model.samples == 3


@pytest.mark.parametrize(
    "state",
    [
        None,
        "garbage",
        [],
        {},
        {"decay": 0.95},
        {**_GOOD_LATENCY_STATE, "decay": "x"},
        {**_GOOD_LATENCY_STATE, "decay": 7.0},
        {**_GOOD_LATENCY_STATE, "decay": True},
        {**_GOOD_LATENCY_STATE, "samples": math.nan},
        {**_GOOD_LATENCY_STATE, "samples": 2.5},
        {**_GOOD_LATENCY_STATE, "w": -1.0},
        {**_GOOD_LATENCY_STATE, "c_nn": math.inf},
        {**_GOOD_LATENCY_STATE, "mean_y": None},
        {k: v for k, v in _GOOD_LATENCY_STATE.items() if k != "c_ny"},
    ],
)
def test_latency_model_bad_state_starts_fresh(state: object) -> None:
    model = LatencyModel.from_state(state)
    assert not model.fitted
    assert (model.a, model.b) == (0.0, 0.0)


# --------------------------------------------------------------------------- ArrivalRate


def test_arrival_rate_converges_to_steady_rate() -> None:
    rate = ArrivalRate(tau_s=2.0)
    t = T0
    for _ in range(2000):  # 100/s for 20 s
        rate.record(t)
        t += 0.010
    assert rate.rate(t) == pytest.approx(100.0, rel=0.05)
    assert rate.expected_gap(t) == pytest.approx(0.010, rel=0.05)


def test_arrival_rate_counts_batched_records() -> None:
    rate = ArrivalRate(tau_s=2.0)
    t = T0
    for _ in range(400):  # 8 every 40 ms = 200/s for 16 s
        rate.record(t, count=8)
        t += 0.040
    assert rate.rate(t) == pytest.approx(200.0, rel=0.05)


def test_arrival_rate_warms_up_quickly() -> None:
    # Bias correction: a fresh estimator is already close after a handful of
    # arrivals, rather than climbing from 0 over several tau.
    rate = ArrivalRate(tau_s=2.0)
    for k in range(11):
        rate.record(T0 + k * 0.010)
    assert rate.rate(T0 + 0.100) == pytest.approx(100.0, rel=0.05)


def test_arrival_rate_decays_toward_zero_after_silence() -> None:
    rate = ArrivalRate(tau_s=2.0)
    t = T0
    for _ in range(2000):
        rate.record(t)
        t += 0.010
    last = t - 0.010
    steady = rate.rate(last)
    one_tau = rate.rate(last + 2.0)
    five_tau = rate.rate(last + 10.0)
    assert one_tau == pytest.approx(steady * math.exp(-1.0), rel=0.01)
    assert five_tau < 0.01 * steady
    assert rate.rate(last + 100.0) < 1e-9
    assert rate.expected_gap(last + 10.0) > 100 * rate.expected_gap(last)


def test_arrival_rate_is_zero_before_an_interval_is_seen() -> None:
    rate = ArrivalRate()
    assert rate.rate(T0) == 0.0
    assert rate.expected_gap(T0) == math.inf
    rate.record(T0)  # the first arrival only starts the clock
    assert rate.rate(T0 + 0.005) == 0.0
    rate.record(T0 + 0.010)
    assert rate.rate(T0 + 0.010) == pytest.approx(100.0, rel=0.01)


def test_arrival_rate_ignores_time_going_backwards() -> None:
    rate = ArrivalRate()
    rate.record(T0)
    rate.record(T0 + 0.1)
    before = rate.rate(T0 + 0.1)
    assert rate.rate(T0) == before  # querying the past reads as "now"
    rate.record(T0 + 0.05)  # a late timestamp counts at the last time seen
    assert math.isfinite(rate.rate(T0 + 0.1))
    assert rate.rate(T0 + 0.1) > before


def test_arrival_rate_restore_resumes_last_rate() -> None:
    rate = ArrivalRate(tau_s=3.0)
    t = T0
    for _ in range(1000):
        rate.record(t)
        t += 0.010
    last = t - 0.010
    state = json.loads(json.dumps(rate.to_state()))
    assert all(isinstance(v, float) for v in state.values())

    # A restarted worker: a different monotonic clock origin.
    restarted = ArrivalRate.from_state(state)
    assert restarted.tau_s == 3.0
    assert restarted.rate(5.0) == pytest.approx(rate.rate(last), rel=1e-12)
    # ... and it decays from where it was first used.
    assert restarted.rate(5.0 + 3.0) == pytest.approx(rate.rate(last + 3.0), rel=1e-9)


@pytest.mark.parametrize(
    "state",
    [
        None,
        42,
        {},
        {"rate": 10.0},
        {"tau_s": 0.0, "rate": 10.0},
        {"tau_s": -2.0, "rate": 10.0},
        {"tau_s": 2.0, "rate": -10.0},
        {"tau_s": 2.0, "rate": math.inf},
        {"tau_s": 2.0, "rate": "fast"},
        {"tau_s": 2.0, "rate": 10.0, "weight": 2.0},
        {"tau_s": 2.0, "rate": 10.0, "weight": None},
    ],
)
def test_arrival_rate_bad_state_starts_fresh(state: object) -> None:
    rate = ArrivalRate.from_state(state)
    assert rate.rate(T0) == 0.0


def test_arrival_rate_validation() -> None:
    with pytest.raises(ValueError, match="tau_s"):
        ArrivalRate(tau_s=0.0)
    with pytest.raises(ValueError, match="count"):
        ArrivalRate().record(T0, count=-1)


# --------------------------------------------------------------------------- WindowPolicy state


def _tuned_policy(config: WindowConfig) -> tuple[WindowPolicy, float]:
    policy = WindowPolicy(config)
    t = T0
    for i in range(600):  # ~150 req/s with some jitter
        policy.record_arrivals(t, count=1 + i % 2)
        t += 0.010 + 0.003 * (i % 3)
    for n in (1, 4, 9, 16, 25, 30, 12, 7):
        policy.observe_batch(n, 0.004 * n + 0.030 + 0.0001 * (n % 3))
    return policy, t - 0.010 - 0.003 * (599 % 3)


def test_policy_state_round_trip_makes_same_decisions() -> None:
    config = WindowConfig(max_batch_size=32, max_batch_tokens=2048, max_wait_s=0.080)
    original, last = _tuned_policy(config)
    state = json.loads(json.dumps(original.to_state()))
    restored = WindowPolicy.from_state(config, state)

    assert restored.latency.a == original.latency.a
    assert restored.latency.b == original.latency.b
    assert restored.window_s(last) == pytest.approx(original.window_s(last))
    assert restored.target_batch_size(last) == original.target_batch_size(last)

    # Same inputs from the snapshot point on -> same decisions.
    now = last
    seen: set[ReleaseReason] = set()
    for step in range(300):
        size = 1 + step % 40
        oldest = now - 0.001 * (step % 100)
        deadline = None if step % 4 else now + 0.05 + 0.001 * step
        a = original.decide(
            now, size=size, tokens=60 * size, oldest_arrival=oldest, earliest_deadline=deadline
        )
        b = restored.decide(
            now, size=size, tokens=60 * size, oldest_arrival=oldest, earliest_deadline=deadline
        )
        assert a.release == b.release
        assert a.reason == b.reason
        assert a.wait_s == pytest.approx(b.wait_s, rel=1e-9, abs=1e-12)
        seen.add(a.reason)
        if step % 3 == 0:
            original.record_arrivals(now)
            restored.record_arrivals(now)
        now += 0.004 * (step % 7)
    # The sweep exercised more than one branch.
    assert len(seen) >= 4


@pytest.mark.parametrize(
    "state",
    [
        None,
        "junk",
        b"\x00\x01",
        {},
        {"latency": "x", "arrivals": 5},
        {"latency": {"decay": math.nan}, "arrivals": {"tau_s": 2.0, "rate": "nan"}},
        {"latency": [1, 2, 3], "arrivals": {"tau_s": -1.0, "rate": 5.0}},
    ],
)
def test_policy_bad_state_gives_fresh_policy(state: object) -> None:
    config = WindowConfig(max_batch_size=8, max_batch_tokens=None, max_wait_s=0.050)
    policy = WindowPolicy.from_state(config, state)
    assert policy.config is config
    assert not policy.latency.fitted
    assert policy.arrivals.rate(T0) == 0.0
    d = policy.decide(T0, size=1, tokens=1, oldest_arrival=T0, earliest_deadline=None)
    assert d.reason is ReleaseReason.WINDOW


def test_policy_partial_state_keeps_the_good_part() -> None:
    config = WindowConfig(max_batch_size=8, max_batch_tokens=None, max_wait_s=0.050)
    tuned = WindowPolicy(config, latency=fitted_model(0.006, 0.014))
    state = {"latency": tuned.to_state()["latency"], "arrivals": "corrupt"}
    policy = WindowPolicy.from_state(config, state)
    assert policy.latency.a == pytest.approx(0.006, abs=1e-6)
    assert policy.arrivals.rate(T0) == 0.0


# --------------------------------------------------------------------------- WindowConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": -3}, "max_batch_size"),
        ({"max_batch_tokens": 0}, "max_batch_tokens"),
        ({"max_wait_s": -0.001}, "max_wait_s"),
        ({"max_wait_s": math.nan}, "max_wait_s"),
        ({"deadline_margin": 0.0}, "deadline_margin"),
    ],
)
def test_window_config_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"max_batch_size": 8, "max_batch_tokens": None, "max_wait_s": 0.05}
    base.update(kwargs)
    bad_value = next(iter(kwargs.values()))
    with pytest.raises(ValueError, match=field) as info:
        WindowConfig(**base)  # type: ignore[arg-type]
    assert repr(bad_value) in str(info.value)


def test_window_config_accepts_valid_values() -> None:
    config = WindowConfig(max_batch_size=1, max_batch_tokens=1, max_wait_s=0.0)
    assert config.deadline_margin == 1.2
    with pytest.raises(AttributeError):
        config.max_batch_size = 2  # type: ignore[misc]


def test_zero_max_wait_releases_immediately() -> None:
    config = WindowConfig(max_batch_size=8, max_batch_tokens=None, max_wait_s=0.0)
    policy = WindowPolicy(config, arrivals=fixed_rate(1e5))
    d = policy.decide(T0, size=1, tokens=1, oldest_arrival=T0, earliest_deadline=None)
    assert d.reason is ReleaseReason.MAX_WAIT


# --------------------------------------------------------------------------- window_s


def test_window_grows_with_arrival_rate_and_is_capped_by_max_wait() -> None:
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.050)
    latency = fitted_model(a=0.0005, b=0.100)

    def window(per_second: float) -> tuple[float, int]:
        policy = WindowPolicy(config, latency=latency, arrivals=fixed_rate(per_second))
        return policy.window_s(T0), policy.target_batch_size(T0)

    # Too sparse to pay: no window at all.
    assert window(1.0) == (0.0, 1)
    assert window(10.0) == (0.0, 1)
    # Faster: hold open for one more arrival (1 gap = 40 ms, under the cap).
    w25, k25 = window(25.0)
    assert w25 == pytest.approx(0.040)
    assert k25 == 2
    # Faster still: the rule would wait longer than max_wait -> capped.
    w100, k100 = window(100.0)
    w1000, k1000 = window(1000.0)
    assert w100 == pytest.approx(0.050)
    assert w1000 == pytest.approx(0.050)
    assert 1 < k25 < k100 < k1000
    assert k100 == 6  # arrivals at 0, 10, ..., 50 ms
    # Never beyond max_wait_s, whatever the rate.
    for per_second in (30.0, 200.0, 5000.0, 1e5):
        w, k = window(per_second)
        assert 0.0 <= w <= config.max_wait_s
        assert 1 <= k <= config.max_batch_size


def test_window_is_bounded_by_max_batch_size() -> None:
    config = WindowConfig(max_batch_size=16, max_batch_tokens=None, max_wait_s=0.050)
    policy = WindowPolicy(config, latency=fitted_model(0.0001, 0.100), arrivals=fixed_rate(1e4))
    assert policy.target_batch_size(T0) == 16
    assert policy.window_s(T0) == pytest.approx(15 * 1e-4)


def test_window_matches_the_decide_loop() -> None:
    # window_s/target_batch_size predict what decide does on a steady stream.
    config = WindowConfig(max_batch_size=64, max_batch_tokens=None, max_wait_s=0.200)
    latency = fitted_model(a=0.002, b=0.060)
    gap = 0.004
    predicted = WindowPolicy(config, latency=latency, arrivals=fixed_rate(1 / gap))
    k = predicted.target_batch_size(T0)
    w = predicted.window_s(T0)
    assert 1 < k < config.max_batch_size  # the pay rule, not a bound, decides
    assert w < config.max_wait_s

    policy = WindowPolicy(config, latency=latency, arrivals=warmed_rate(gap, T0, history_s=20.0))
    out = drive(policy, start=T0, gap=gap)
    assert out.decision.reason is ReleaseReason.WINDOW
    assert out.size == k
    assert out.released_at - T0 == pytest.approx(w, abs=1e-9)


def test_window_is_zero_without_arrivals() -> None:
    policy = WindowPolicy(WindowConfig(max_batch_size=8, max_batch_tokens=None, max_wait_s=0.05))
    assert policy.window_s(T0) == 0.0
    assert policy.target_batch_size(T0) == 1
