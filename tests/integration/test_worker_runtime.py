"""The worker's runtime against a real server: leases kept through a forward three times
longer than the lease (with the default heartbeat and a sweeping second worker), suspects
isolated in parallel by several workers, and a worker whose serve loop fails exits non-zero
with one log line and stops heartbeating."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest
import redis

import inferq
from inferq.protocol import ops
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.lifecycle import EXIT_FAILED, EXIT_OK
from inferq.worker.models.base import ModelInput
from inferq.worker.models.builtin import EchoModel, SleepModel
from inferq.worker.window.worker import WindowWorker
from tests.support.generation import MODEL, gen_config
from tests.support.window_worker import KEYS, config, run_worker, stop

if TYPE_CHECKING:  # torch loads slowly: imported when used
    from inferq.worker.models.lm import CausalLM


async def test_a_forward_three_leases_long_is_not_reclaimed_with_the_default_heartbeat(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    # Lease 400 ms, heartbeat at the default lease / 4, forward 1.2 s. A second worker on
    # the queue sweeps expired leases every lease / 8 meanwhile: nothing may be reclaimed.
    slow = WindowWorker(config(redis_url, lease_ms=400, worker_id="slow"),
                        SleepModel(batch_ms=1200))
    assert slow.config.heartbeat_s == pytest.approx(0.1)
    assert slow.config.reclaim_s == pytest.approx(0.05)
    slow_task = await run_worker(slow)
    handles = await aclient.enqueue_many([f"r{i}" for i in range(4)], model="t")
    await asyncio.wait_for(_inflight(r, 4), 10)  # all four in the slow worker's forward
    sweeper = WindowWorker(config(redis_url, lease_ms=400, worker_id="sweeper"), EchoModel())
    sweeper_task = await run_worker(sweeper)
    results = [await h.result(timeout=30) for h in handles]
    await stop(sweeper, sweeper_task)
    await stop(slow, slow_task)
    assert {res.worker for res in results} == {"slow"}
    assert all(res.attempts == 1 for res in results)
    assert r.hget(KEYS.stats, "reclaimed") is None
    assert slow.stats.refused == 0
    assert slow.heartbeat.beats >= 5  # it beat all along the forward (every 100 ms)


async def _inflight(r: redis.Redis, n: int) -> None:
    while r.zcard(KEYS.inflight) < n:
        await asyncio.sleep(0.01)


def make_suspects(r: redis.Redis, url: str, n: int, *, alone: bool = True) -> list[str]:
    """``n`` requests claimed and started by workers that are about to die (their leases far
    from expiry): each alone on a worker of its own (``alone``), or all in one batch."""
    client = inferq.Client(url)
    ids = [h.id for h in client.enqueue_many([f"s{i}" for i in range(n)], model="t")]
    client.close()
    scripts = ops.register(r)
    claimed: list[ops.Claimed] = []
    for owner in ([f"dead-worker-{i}" for i in range(n)] if alone else ["dead-worker"]):
        keys, args = ops.claim_call(KEYS, owner, 600_000, 1 if alone else n, 60_000)
        claimed += ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
    assert len(claimed) == n
    keys, args = ops.start_call(KEYS, [(c.id, c.token) for c in claimed])
    scripts["start"](keys=keys, args=args)  # the dead workers had started them
    return ids


async def test_suspects_are_isolated_in_parallel_across_workers(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    ids = make_suspects(r, redis_url, 9)
    workers = [WindowWorker(config(redis_url, lease_ms=1_000, worker_id=f"w{i}",
                             max_batch_size=16), SleepModel(batch_ms=150))
               for i in range(3)]
    tasks = [await run_worker(w) for w in workers]
    while r.zcard(KEYS.workers) < 3:  # all three up and idle
        await asyncio.sleep(0.01)
    # The dead workers' leases run out: the next sweep returns all nine, each now a suspect
    # (each was lost while it ran alone; a lost run is not an attempt).
    r.zadd(KEYS.inflight, {i: 0 for i in ids})
    handles = [aclient.handle(i, model="t") for i in ids]
    results = [await h.result(timeout=30) for h in handles]
    for worker, task in zip(workers, tasks, strict=True):
        await stop(worker, task)
    assert all(res.status.value == "ok" and res.attempts == 1 and res.lost_runs == 1
               for res in results)
    assert all(res.batch_size == 1 for res in results)  # each ran alone
    # Shared out: every worker ran some of them; a worker holding one gave the others back.
    assert {res.worker for res in results} == {"w0", "w1", "w2"}
    assert sum(w.stats.suspects_shared for w in workers) > 0
    assert r.zcard(KEYS.pending) == 0 and r.zcard(KEYS.inflight) == 0


async def test_a_dead_workers_batch_reruns_in_halves_in_parallel_across_workers(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    ids = make_suspects(r, redis_url, 9, alone=False)
    workers = [WindowWorker(config(redis_url, lease_ms=1_000, worker_id=f"w{i}",
                             max_batch_size=16), SleepModel(batch_ms=150))
               for i in range(3)]
    tasks = [await run_worker(w) for w in workers]
    while r.zcard(KEYS.workers) < 3:  # all three up and idle
        await asyncio.sleep(0.01)
    # The dead worker's leases run out: its batch of nine comes back, each request capped at
    # half of it (5): no attempt used, none a suspect.
    r.zadd(KEYS.inflight, {i: 0 for i in ids})
    handles = [aclient.handle(i, model="t") for i in ids]
    results = [await h.result(timeout=30) for h in handles]
    for worker, task in zip(workers, tasks, strict=True):
        await stop(worker, task)
    assert all(res.status.value == "ok" and res.attempts == 1 and res.lost_runs == 1
               for res in results)
    sizes = [res.batch_size or 0 for res in results]
    assert max(sizes) == 5 and all(size <= 5 for size in sizes)  # halves, not one by one
    assert len({res.worker for res in results}) >= 2  # the other half went elsewhere
    assert r.zcard(KEYS.pending) == 0 and r.zcard(KEYS.inflight) == 0


async def test_a_failing_serve_loop_exits_non_zero_and_stops_heartbeating(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = WindowWorker(config(redis_url, lease_ms=400, worker_id="broken"), EchoModel())
    entered = asyncio.Event()

    async def broken_build_batch() -> None:
        entered.set()
        await asyncio.sleep(0.3)  # long enough for a few heartbeats
        raise RuntimeError("boom")

    monkeypatch.setattr(worker, "_build_batch", broken_build_batch)
    caplog.set_level(logging.INFO, logger="inferq.worker")
    task = await run_worker(worker)
    await asyncio.wait_for(entered.wait(), 10)
    assert r.zscore(KEYS.workers, "broken") is not None  # alive while serving
    code = await asyncio.wait_for(task, 10)
    assert code == EXIT_FAILED
    lines = [rec.getMessage() for rec in caplog.records if "cannot go on" in rec.getMessage()]
    assert lines == ["worker broken cannot go on: RuntimeError: boom"]
    assert not worker.heartbeat.is_alive()
    assert r.zscore(KEYS.workers, "broken") is None  # no longer listed as live
    beats = worker.heartbeat.beats
    await asyncio.sleep(0.3)  # three heartbeat periods
    assert worker.heartbeat.beats == beats


async def test_a_clean_stop_exits_zero(redis_url: str) -> None:
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    await asyncio.wait_for(worker.serving.wait(), 30)
    worker.request_stop()
    assert await asyncio.wait_for(task, 30) == EXIT_OK
    assert not worker.abandoned


async def test_a_generate_worker_whose_publisher_dies_cannot_go_on(
        redis_url: str, r: redis.Redis, lm: CausalLM, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from inferq.worker.generate.publisher import StreamPublisher
    from inferq.worker.generate.worker import GenerationWorker

    async def broken_run(self: StreamPublisher) -> None:
        raise RuntimeError("publisher broke")

    monkeypatch.setattr(StreamPublisher, "run", broken_run)
    caplog.set_level(logging.INFO, logger="inferq.worker")
    worker = GenerationWorker(gen_config(redis_url, worker_id="gen-broken"), lm)
    code = await asyncio.wait_for(worker.run(install_signal_handlers=False), 30)
    assert code == EXIT_FAILED
    assert ("worker gen-broken cannot go on: RuntimeError: the stream publisher ended: "
            "RuntimeError: publisher broke") in caplog.text
    assert not worker.heartbeat.is_alive()
    assert r.zscore(QueueKeys.for_model("generate", MODEL).workers, "gen-broken") is None


async def test_a_worker_whose_maintenance_dies_cannot_go_on(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Without its maintenance, a worker would serve on but never reclaim or report health.
    worker = WindowWorker(config(redis_url, lease_ms=400, worker_id="unmaintained"), EchoModel())

    async def broken_upkeep(reclaimed: tuple[int, int]) -> None:
        raise KeyError("stats")

    monkeypatch.setattr(worker, "_upkeep", broken_upkeep)
    caplog.set_level(logging.INFO, logger="inferq.worker")
    code = await asyncio.wait_for(worker.run(install_signal_handlers=False), 30)
    assert code == EXIT_FAILED
    assert ("worker unmaintained cannot go on: the maintenance loop ended: KeyError: 'stats'"
            in caplog.text)
    assert not worker.heartbeat.is_alive()
    assert r.zscore(KEYS.workers, "unmaintained") is None


class SpinningModel(EchoModel):
    """A forward that holds the GIL in pure Python for ``spin_s`` (a GIL-bound model)."""

    def __init__(self, spin_s: float) -> None:
        super().__init__()
        self.spin_s = spin_s

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        end = time.perf_counter() + self.spin_s
        n = 0
        while time.perf_counter() < end:
            n += 1
        return super().forward(batch)


async def test_a_gil_bound_forward_three_leases_long_keeps_its_leases(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    # Python hands the GIL over every few milliseconds, so the heartbeat thread still beats.
    worker = WindowWorker(config(redis_url, lease_ms=400, worker_id="spinner"), SpinningModel(1.2))
    task = await run_worker(worker)
    handles = await aclient.enqueue_many(["a", "b"], model="t")
    results = [await h.result(timeout=30) for h in handles]
    await stop(worker, task)
    assert all(res.attempts == 1 and res.worker == "spinner" for res in results)
    assert r.hget(KEYS.stats, "reclaimed") is None
    assert worker.stats.refused == 0
