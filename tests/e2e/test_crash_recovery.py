"""A worker killed with SIGKILL mid-batch loses nothing: another finishes every request."""

from __future__ import annotations

import signal
from collections.abc import Callable

import redis

import inferq
from inferq.protocol.keys import QueueKeys
from tests.support.processes import WorkerProcess, wait_until

KEYS = QueueKeys.for_model("embed", "slow")
SLOW = "slow=builtin:sleep?batch_ms=1500"


def test_sigkill_mid_batch_then_a_second_worker_finishes_everything(
        redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]) -> None:
    client = inferq.Client(redis_url)
    handles = client.enqueue_many([f"req-{i}" for i in range(24)], model="slow")
    first = start_worker("--model", SLOW, "--lease-ms", "1500", "--max-batch-size", "8",
                         "--worker-id", "doomed")
    # Mid-batch: the first worker holds leases (its forward sleeps 1.5 s per batch).
    wait_until(lambda: r.scard(KEYS.started) > 0, 60, "the first worker's model to start")
    held = {m.decode() for m in r.zrange(KEYS.inflight, 0, -1)}
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    assert all(h.peek() is None for h in handles if h.id in held)
    # Those its model had started count a lost run (not an attempt); those only claimed (its
    # next window) nothing.
    ran = {m.decode() for m in r.smembers(KEYS.started)}
    assert ran and ran <= held

    second = start_worker("--model", SLOW, "--lease-ms", "1500", "--max-batch-size", "8",
                          "--worker-id", "survivor")
    results = [h.result(timeout=60) for h in handles]
    assert [r_.output for r_ in results] == [f"req-{i}" for i in range(24)]
    by_id = {r_.id: r_ for r_ in results}
    for request_id in held:  # the killed worker's requests ran again, on the survivor
        assert by_id[request_id].attempts == 1
        assert by_id[request_id].lost_runs == (1 if request_id in ran else None)
        assert by_id[request_id].worker == "survivor"
    assert r.zcard(KEYS.inflight) == 0 and r.zcard(KEYS.pending) == 0
    assert int(r.hget(KEYS.stats, "reclaimed") or 0) == len(held)
    assert int(r.hget(KEYS.stats, "ok") or 0) == 24  # each result written exactly once
    assert second.stop() == 0
    client.close()


def test_a_worker_paused_past_its_lease_has_its_completion_refused(
        redis_url: str, r: redis.Redis, start_worker: Callable[..., WorkerProcess]) -> None:
    client = inferq.Client(redis_url)
    handles = client.enqueue_many([f"req-{i}" for i in range(8)], model="slow")
    paused = start_worker("--model", SLOW, "--lease-ms", "1000", "--max-batch-size", "8",
                          "--worker-id", "paused")
    # The forward sleeps 1.5 s: stopped right after it starts (START marks the batch as
    # running right before it), the worker is mid-forward (a worker stopped before its batch
    # forms drops the lost claims unrun instead).
    wait_until(lambda: r.scard(KEYS.started) == 8, 60, "the forward to start")
    paused.proc.send_signal(signal.SIGSTOP)  # a GC pause / frozen VM, mid-forward
    try:
        second = start_worker("--model", SLOW, "--lease-ms", "1000", "--max-batch-size", "8",
                              "--worker-id", "second")
        results = [h.result(timeout=60) for h in handles]
        assert {res.worker for res in results} == {"second"}
        assert all(res.attempts == 1 and res.lost_runs == 1 for res in results)
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    # The paused worker wakes, finishes its forward and tries to complete: refused.
    wait_until(lambda: int(r.hget(KEYS.stats, "refused") or 0) == 8, 30,
               "the zombie's completion to be refused")
    assert int(r.hget(KEYS.stats, "ok") or 0) == 8  # no duplicate result was written
    assert [h.result(timeout=1).worker for h in handles] == ["second"] * 8
    assert paused.stop() == 0 and second.stop() == 0
    client.close()
