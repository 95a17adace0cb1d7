"""The desired-workers signal of a ``generate`` queue in a loop, on loopback: the twin of
``test_autoscale_loop`` for continuous batching. A small controller starts and stops real
``inferq worker --task generate`` processes (the tiny Llama) by ``inferq_workers_desired``,
which for a generate queue comes from token demand against the workers' measured decode and
prefill capacity (``inferq.autoscale.TokenFit``), while the offered load steps 1x -> 3x -> 1x.
Workers must follow (a second one for the 3x step, given back after it, by SIGTERM: a drain)
and the time to first token stay under the queue's target except for requests that arrived
while a worker was starting.

The load is sized from the capacity the signal itself fitted, read at the steps' start (this
shared 2-core box runs at very different speeds from one minute to the next, and the fit
moves with the load): 3x is 1.1 times what one worker serves at the signal's 80 %
utilisation, so the signal asks for a second worker, and 1x a third of that, which one worker
serves. Unlike the window twin's sleep model, the
tiny model's workers share the same 2 cores: here a second worker adds headroom only as far
as the cores are free, so this test shows the signal and the drain at work, not that two
workers serve twice what one does. Each request decodes 16 tokens (``ignore_eos``), so its
cost does not depend on the random weights.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import inferq
from inferq import plans
from inferq.autoscale import Tracker
from inferq.cli.main import main
from inferq.protocol.keys import QueueKeys
from tests.support.processes import WorkerProcess, wait_until

MODEL = "tinyscale"
KEYS = QueueKeys.for_model("generate", MODEL)
TARGET_MS = 8000
MAX_WORKERS = 3
PARAMS = {"max_new_tokens": 16, "ignore_eos": True}
#: (multiple of 1x, seconds): 1x, 3x, 1x.
STEPS = ((1.0, 6.0), (3.0, 16.0), (1.0, 10.0))


class Controller:
    """Reads the signal every ``period`` s and starts or stops workers to match it; notes
    when each worker started and when it was live (its start: requests enqueued then are
    not held to the target)."""

    def __init__(self, redis_url: str, start: Callable[[], WorkerProcess],
                 period: float = 0.5) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.tracker = Tracker(window_s=3.0)
        self.start_worker, self.period = start, period
        self.workers: list[WorkerProcess] = []
        self.history: list[tuple[float, int, int]] = []  # (time, desired, running)
        self.starts: list[list[float]] = []  # [launched, live] per started worker
        self.capacity: float | None = None  # requests/s of one worker, from the token fit
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            signal = plans.run(self.client, self.tracker.read(KEYS))
            if signal.fit is not None and signal.fit.get("requests_per_s"):
                self.capacity = signal.fit["requests_per_s"]
            now = time.monotonic()
            for start in self.starts:
                if len(start) == 1 and signal.live_workers >= len(self.workers):
                    start.append(now)
            desired = min(MAX_WORKERS, max(1, signal.desired))
            while len(self.workers) < desired:
                self.workers.append(self.start_worker())
                self.starts.append([time.monotonic()])
            while len(self.workers) > desired:
                self.workers.pop().proc.terminate()  # SIGTERM: it drains
            self.history.append((now, signal.desired, len(self.workers)))

    def starting(self, at: float) -> bool:
        """Whether a worker was starting at monotonic time ``at`` (or up to 2 s before it was
        live: its first claims)."""
        return any(s[0] <= at <= (s[1] + 2.0 if len(s) > 1 else float("inf"))
                   for s in self.starts[1:])


def offer(client: inferq.Client, controller: Controller,
          sent: list[tuple[float, inferq.Handle]]) -> list[float]:
    """Enqueue at each step's rate, in small bursts every 50 ms. 1x is sized from the capacity
    the signal fits, read at the first step's start and again at the 3x step's (it moves with
    the load: a worker that ran more sequences at once measured a cheaper step per token),
    which the last step keeps. The rates, in order."""
    rates: list[float] = []
    one_x = 0.0
    for multiple, seconds in STEPS:
        assert controller.capacity is not None
        if multiple > 1 or not rates:
            one_x = 1.1 * 0.8 * controller.capacity / 3
        rate = multiple * one_x
        rates.append(rate)
        start, count = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(rate * elapsed) - count
            if due > 0:
                now = time.monotonic()
                handles = client.enqueue_many([f"question {len(sent) + i} of the queue"
                                               for i in range(due)], model=MODEL,
                                              task="generate", params=PARAMS)
                sent += [(now, h) for h in handles]
                count += due
            time.sleep(0.05)
    return rates


@pytest.mark.timeout(240)
def test_generate_workers_follow_token_demand_and_ttft_stays_under_target(
        redis_url: str, tmp_path: Path, tiny_path: Path) -> None:
    assert main(["queue", "set", f"generate:{MODEL}", "--redis-url", redis_url,
                 "--target-wait-ms", str(TARGET_MS)]) == 0

    def start() -> WorkerProcess:
        return WorkerProcess(redis_url, "--task", "generate", "--model",
                             f"{MODEL}={tiny_path}", "--device", "cpu", "--max-slots", "4",
                             "--torch-threads", "1", "--drain-timeout-s", "10",
                             log_dir=tmp_path)

    controller = Controller(redis_url, start)
    loop = threading.Thread(target=controller.run, daemon=True)
    loop.start()
    sent: list[tuple[float, inferq.Handle]] = []
    try:
        with inferq.Client(redis_url, options=inferq.ClientOptions(warn_no_worker=False)) as c:
            wait_until(lambda: len(c.live_workers(model=MODEL, task="generate")) == 1, 90,
                       "the first worker")
            # warm-up: the worker measures its decode and prefill rates; the signal fits them
            warm = c.enqueue_many([f"warm {i}" for i in range(40)], model=MODEL,
                                  task="generate", params=PARAMS)
            assert all(h.result(timeout=120).ok for h in warm)
            wait_until(lambda: controller.capacity is not None, 30, "a token fit")
            rates = offer(c, controller, sent)
            results = [(at, h.result(timeout=120)) for at, h in sent]
            end = time.monotonic() + 30
            while time.monotonic() < end and controller.history[-1][2] != 1:
                time.sleep(0.2)
    finally:
        controller.stop.set()
        loop.join(10)
        for worker in controller.workers:
            worker.stop()
    held = sorted(r.ttft_ms or 0.0 for at, r in results if not controller.starting(at))
    p99 = held[int(0.99 * (len(held) - 1))]
    most = max(running for _, _, running in controller.history)
    t0 = controller.history[0][0]
    steps = [(round(t - t0, 1), d, n) for t, d, n in controller.history]
    print(f"offered {', '.join(f'{x:.1f}' for x in rates)} req/s (fit at the end: "
          f"{controller.capacity:.1f} a worker); "
          f"{len(results)} "
          f"requests, {len(held)} outside a worker's start, their p99 TTFT {p99:.0f} ms; "
          f"most workers {most}; "
          f"(s, desired, running): {steps}")
    assert all(r.ok for _, r in results)
    assert most >= 2, "the 3x step needs a second worker"
    assert controller.history[-1][2] == 1, "the workers were given back after the step"
    assert p99 < TARGET_MS
