"""The desired-workers signal (``inferq.autoscale``), numerically: the estimators fed with
simulated arrivals and batch latencies, the count compared with the analytic one."""

from __future__ import annotations

import math
import random

import pytest

from inferq.autoscale import (
    Demand,
    Fit,
    Target,
    TokenFit,
    Tracker,
    desired_workers,
    fit_from_windows,
    token_fit_from_windows,
)
from inferq.worker.window.policy import LatencyModel

RHO = 0.8


def simulated_fit(a: float, b: float, rng: random.Random, limit: int = 32) -> Fit:
    """The worker's own online fit (``LatencyModel``) of noisy batches of a·n + b."""
    model = LatencyModel()
    for _ in range(300):
        n = rng.randint(1, limit)
        model.observe(n, max(0.0, (a * n + b) * rng.uniform(0.97, 1.03)))
    return Fit(model.a, model.b, limit)


def simulated_rate(tracker: Tracker, rate: float, rng: random.Random, seconds: float = 30,
                   step: float = 2.0) -> float:
    """Poisson arrivals at ``rate`` counted by the enqueue sequence, read every ``step`` s."""
    seq, t, measured = 0, 0.0, 0.0
    tracker.observe("q", t, seq, 0, 0, None)
    while t < seconds:
        t += step
        seq += sum(1 for _ in range(int(rate * step * 3)) if rng.random() < 1 / 3)
        measured, _ = tracker.observe("q", t, seq, 0, 0, None)
    return measured


@pytest.mark.parametrize(("rate", "backlog", "a", "b", "wait_s"), [
    # a target longer than a full batch (32 a + b): batches fill up to the limit
    (400.0, 0, 0.002, 0.030, 1.0),
    (1500.0, 0, 0.002, 0.030, 1.0),
    (1500.0, 6000, 0.002, 0.030, 2.0),
    (250.0, 2000, 0.004, 0.050, 0.5),
    (3000.0, 0, 0.001, 0.060, 1.0),
])
def test_full_batches_under_a_loose_target_give_the_analytic_count_within_one(
        rate: float, backlog: int, a: float, b: float, wait_s: float) -> None:
    rng = random.Random(f"{rate}-{backlog}")
    fit = simulated_fit(a, b, rng)
    measured = simulated_rate(Tracker(window_s=30), rate, rng)
    mu = 32 / (a * 32 + b)  # a worker running full batches
    analytic = math.ceil(rate / (RHO * mu) + backlog / (wait_s * mu))
    got = desired_workers(Demand(measured, backlog), fit, Target(wait_s=wait_s))
    assert abs(got - analytic) <= 1, (got, analytic, measured, fit)


@pytest.mark.parametrize(("rate", "backlog"), [(100.0, 0), (300.0, 0), (300.0, 50)])
def test_a_tight_target_caps_the_batch_and_gives_the_analytic_count(
        rate: float, backlog: int) -> None:
    # a batch must end within the 50 ms target: (0.05 - 0.01) / 0.01 = 4 requests
    a, b, wait_s = 0.010, 0.010, 0.050
    rng = random.Random(rate)
    fit = simulated_fit(a, b, rng)
    measured = simulated_rate(Tracker(window_s=30), rate, rng)
    mu = 4 / (a * 4 + b)
    analytic = math.ceil(rate / (RHO * mu) + backlog / (wait_s * mu))
    got = desired_workers(Demand(measured, backlog), fit, Target(wait_s=wait_s))
    assert abs(got - analytic) <= 1, (got, analytic, measured, fit)


def test_the_batch_under_the_target_is_the_longest_that_ends_in_time() -> None:
    fit = Fit(0.002, 0.030, 16)
    assert [fit.batch_within(w) for w in (0.01, 0.032, 0.04, 0.05, 1.0)] == [1, 1, 5, 10, 16]
    assert Fit(0.0, 0.02, 8).batch_within(0.05) == 8


def test_scale_to_zero_after_idle_and_activation_at_the_first_request() -> None:
    fit = Fit(0.002, 0.030)
    target = Target(wait_s=1.0, idle_s=300)
    assert desired_workers(Demand(0.0, 0, 0, idle_s=299), fit, target) == 1
    assert desired_workers(Demand(0.0, 0, 0, idle_s=300), fit, target) == 0
    # one request waits: at least one worker, at once, with or without a fit
    assert desired_workers(Demand(0.0, 1, 0, idle_s=999), fit, target) == 1
    assert desired_workers(Demand(0.0, 1, 0, idle_s=999), None, target) == 1
    assert desired_workers(Demand(0.0, 0, 1, idle_s=999), None, target) == 1


def test_the_tracker_measures_idle_time_and_survives_a_counter_reset() -> None:
    tracker = Tracker(window_s=10)
    tracker.observe("q", 0.0, 100, 0, 0, None)
    rate, idle = tracker.observe("q", 5.0, 150, 0, 0, None)
    assert rate == pytest.approx(10.0) and idle == 0
    rate, idle = tracker.observe("q", 40.0, 150, 0, 0, None)
    assert rate == 0.0 and idle == pytest.approx(35.0)
    rate, idle = tracker.observe("q", 41.0, 3, 2, 0, None)  # seq reset, a backlog
    assert rate == 0.0 and idle == 0.0


def test_fits_come_from_the_windows_of_workers_that_ran_batches() -> None:
    windows = [{"latency_a_ms": "2", "latency_b_ms": "30", "batches": "5", "batch_limit": "16"},
               {"latency_a_ms": "4", "latency_b_ms": "10", "batches": "9", "batch_limit": "32"},
               {"latency_a_ms": "9", "latency_b_ms": "9", "batches": "0"},
               {"latency_a_ms": "oops", "latency_b_ms": "1", "batches": "3"}]
    fit = fit_from_windows(windows)
    assert fit == Fit(pytest.approx(0.003), pytest.approx(0.020), 32)  # type: ignore[arg-type]
    assert fit_from_windows([{"batches": "0"}]) is None


def test_a_generate_queue_is_sized_on_tokens() -> None:
    # a step of n sequences takes 2 ms·n + 20 ms; 8 slots: 8 / 0.036 = 222 tokens a second
    fit = TokenFit(0.002, 0.020, 8, prompt_tokens=100, output_tokens=50,
                   prefill_per_s=5000)
    assert fit.decode_per_s() == pytest.approx(8 / 0.036)
    seconds = 50 / (8 / 0.036) + 100 / 5000  # output at the decode rate, prompt at prefill's
    assert fit.capacity() == pytest.approx(1 / seconds)
    # demand in tokens: 20 requests a second are 2,000 prompt and 1,000 output tokens a second
    analytic = math.ceil(20 * seconds / RHO + 30 * seconds / 0.5)  # 30 queued, 0.5 s TTFT
    assert desired_workers(Demand(20.0, 30), fit, Target(wait_s=0.5)) == analytic
    # a KV cache of 450 tokens holds 3 requests of 150 tokens: 3 running, not 8
    small = TokenFit(0.002, 0.020, 8, 100, 50, 5000, kv_tokens=450)
    assert small.running() == 3 and small.decode_per_s() == pytest.approx(3 / 0.026)
    assert desired_workers(Demand(20.0, 0), small, Target()) > desired_workers(
        Demand(20.0, 0), fit, Target())


def test_token_fits_come_from_continuous_workers_that_finished_requests() -> None:
    gen = {"mode": "continuous", "decode_a_ms": "2", "decode_b_ms": "20", "max_slots": "8",
           "kv_tokens": "4096", "prefill_tokens_per_s": "5000", "requests": "10",
           "tokens": "500", "prefill_tokens": "1000"}
    other = {**gen, "decode_a_ms": "4", "prefill_tokens_per_s": "3000", "requests": "30",
             "tokens": "1500", "prefill_tokens": "3000"}
    fit = token_fit_from_windows([gen, other, {"mode": "continuous", "max_slots": "4"},
                                  {"latency_a_ms": "1", "latency_b_ms": "1", "batches": "3"}])
    assert fit == TokenFit(pytest.approx(0.003), pytest.approx(0.020), 8,  # type: ignore[arg-type]
                           100.0, 50.0, 4000.0, 4096)
    assert token_fit_from_windows([{**gen, "requests": "0"}]) is None  # nothing finished
    assert token_fit_from_windows([{"latency_a_ms": "1", "batches": "3"}]) is None
