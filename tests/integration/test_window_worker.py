"""The worker loop in-process against a real server, with small test models."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import pytest
import redis

import inferq
from inferq.errors import InferqError
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.processes import wait_until
from tests.support.window_worker import KEYS, config, run_worker, stop


class ScriptedModel(BatchModel):
    """Echo model with hooks: records batch sizes, can block, and fails on 'poison'."""

    tasks = frozenset({"*"})

    def __init__(self) -> None:
        self.model_id = "scripted"
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        out: list[ModelInput | InferqError] = []
        for p in payloads:
            if p.prompt == "unpreparable":
                out.append(inferq.InvalidInput("cannot tokenize this"))
            else:
                out.append(ModelInput(len(p.prompt), p.prompt))
        return out

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        self.started.set()
        self.gate.wait(timeout=30)
        texts = [item.data for item in batch]
        self.batches.append(texts)
        if any("poison" in t for t in texts):
            raise RuntimeError("poisoned batch")
        return [t.upper() for t in texts]


async def gather_results(handles: Sequence[inferq.AsyncHandle]) -> list[inferq.Result]:
    return list(await asyncio.gather(*(h.result(timeout=30) for h in handles)))


async def test_backlog_is_served_in_batches_larger_than_one(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    handles = await aclient.enqueue_many([f"r{i}" for i in range(60)], model="t")
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    results = await gather_results(handles)
    await stop(worker, task)
    assert [r.output for r in results] == [f"r{i}" for i in range(60)]
    assert max(r.batch_size or 0 for r in results) == 8
    assert all(r.worker == "test-worker" and r.attempts == 1 for r in results)
    assert all(r.queue_wait_ms is not None and r.queue_wait_ms >= 0 for r in results)
    assert worker.stats.batches < 60


async def test_poison_request_fails_alone_and_the_worker_survives(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    model = ScriptedModel()
    model.gate.clear()  # hold the first batch until all requests are queued
    worker = WindowWorker(config(redis_url), model)
    task = await run_worker(worker)
    first = await aclient.enqueue("warmup", model="t")
    await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
    prompts = ["a", "b", "poison", "c", "d", "e", "f"]
    handles = await aclient.enqueue_many(prompts, model="t")
    model.gate.set()
    assert (await first.result(timeout=10)).output == "WARMUP"
    outcomes: dict[str, Any] = {}
    for prompt, handle in zip(prompts, handles, strict=True):
        try:
            outcomes[prompt] = (await handle.result(timeout=10)).output
        except inferq.RequestFailed as exc:
            outcomes[prompt] = exc.error_code
    assert outcomes == {"a": "A", "b": "B", "poison": "model_error", "c": "C", "d": "D",
                        "e": "E", "f": "F"}
    assert any(len(b) == len(prompts) for b in model.batches)  # they did share a batch
    after = await aclient.enqueue("still alive", model="t")
    assert (await after.result(timeout=10)).output == "STILL ALIVE"
    await stop(worker, task)


async def test_malformed_payload_bytes_fail_alone(redis_url: str, r: redis.Redis,
                                                  aclient: inferq.AsyncClient) -> None:
    handles = await aclient.enqueue_many(["ok1", "bad-msgpack", "wrong-type", "ok2",
                                          "unpreparable"], model="t")
    r.hset(KEYS.request(handles[1].id), "p", b"\xc1\xff not msgpack")
    r.hset(KEYS.request(handles[2].id), "p",
           msgpack.packb({"id": handles[2].id, "task": "embed", "model": "t", "prompt": 42}))
    worker = WindowWorker(config(redis_url), ScriptedModel())
    task = await run_worker(worker)
    assert (await handles[0].result(timeout=10)).output == "OK1"
    assert (await handles[3].result(timeout=10)).output == "OK2"
    codes = []
    for handle in (handles[1], handles[2], handles[4]):
        with pytest.raises(inferq.RequestFailed) as info:
            await handle.result(timeout=10)
        codes.append(info.value.error_code)
    assert codes == ["invalid_request", "invalid_request", "invalid_input"]
    await stop(worker, task)


async def test_shutdown_finishes_the_batch_in_hand_and_gives_back_the_rest(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    model = ScriptedModel()
    model.gate.clear()
    worker = WindowWorker(config(redis_url, max_batch_size=2), model)
    handles = await aclient.enqueue_many([f"r{i}" for i in range(7)], model="t")
    task = await run_worker(worker)
    await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
    # The next window is claimed while the first batch runs: 2 running + 2 claimed.
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: r.zcard(KEYS.inflight) == 4, 10, "next window"))
    worker.request_stop()
    model.gate.set()
    await asyncio.wait_for(task, timeout=30)
    done = [h for h in handles if (await h.peek()) is not None]
    assert [h.id for h in done] == [handles[0].id, handles[1].id]
    assert r.zcard(KEYS.inflight) == 0
    assert r.zcard(KEYS.pending) == 5
    for h in handles[2:]:
        assert r.hget(KEYS.request(h.id), "a") == b"0"  # the give-back did not cost an attempt
    assert worker.stats.released == 2
    assert r.zscore(KEYS.workers, "test-worker") is None  # deregistered at once


async def test_tuned_window_state_is_persisted_and_resumed(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    first = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(first)
    await gather_results(await aclient.enqueue_many([f"r{i}" for i in range(40)], model="t"))
    await stop(first, task)
    assert first.policy.latency.samples > 0
    second = WindowWorker(config(redis_url, worker_id="second"), EchoModel())
    task = await run_worker(second)
    await gather_results([await aclient.enqueue("x", model="t")])
    assert second.resumed_tuning
    assert second.policy.latency.samples >= first.policy.latency.samples
    await stop(second, task)


async def test_worker_publishes_window_stats(redis_url: str, r: redis.Redis,
                                             aclient: inferq.AsyncClient) -> None:
    from inferq.stats import read_queue

    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    await gather_results(await aclient.enqueue_many(["a", "b", "c"], model="t", priority=4))
    await gather_results(await aclient.enqueue_many(["later"], model="t"))
    await stop(worker, task)
    stats = read_queue(r, KEYS)
    assert stats.counters.get("ok", 0) == 4
    assert r.hget(KEYS.window("test-worker"), "requests") == b"4"
    assert r.sismember("inferq:queues", "embed:t")


async def test_heartbeat_thread_keeps_leases_alive_through_a_forward_longer_than_the_lease(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    from inferq.worker.models.builtin import SleepModel

    # The forward holds the model thread for 3 lease periods; the heartbeat thread extends
    # the lease every 100 ms meanwhile, so nothing is reclaimed and nothing runs twice.
    worker = WindowWorker(config(redis_url, lease_ms=300, heartbeat_ms=100),
                    SleepModel(batch_ms=900))
    task = await run_worker(worker)
    result = await (await aclient.enqueue("slow", model="t")).result(timeout=30)
    await stop(worker, task)
    assert result.output == "slow" and result.attempts == 1
    assert r.hget(KEYS.stats, "reclaimed") is None
    assert worker.stats.refused == 0


async def test_many_awaited_results_share_one_connection(redis_url: str,
                                                         r: redis.Redis) -> None:
    # With at most 3 connections, 400 concurrent waits can only finish if waiting does not
    # hold a connection each (they would deadlock behind the pool otherwise).
    options = inferq.ClientOptions(max_connections=3)
    async with inferq.AsyncClient(redis_url, options=options,
                                  client_name="inbox-test") as client:
        handles = await client.enqueue_many([f"r{i}" for i in range(400)], model="t")
        waits = [asyncio.ensure_future(h.result(timeout=30)) for h in handles]
        worker = WindowWorker(config(redis_url, max_batch_size=64), EchoModel())
        task = await run_worker(worker)
        results = await asyncio.gather(*waits)
        await stop(worker, task)
        assert [res.output for res in results] == [f"r{i}" for i in range(400)]
        named = [c for c in r.client_list() if c.get("name") == "inbox-test"]
        assert 1 <= len(named) <= 3
        # A handle built from a bare id (another process) blocks on the result key instead.
        other = client.handle(handles[7].id, model="t")
        assert (await other.result(timeout=5)).output == "r7"


async def test_higher_priority_arrival_is_swapped_into_a_preclaimed_window(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    model = ScriptedModel()
    model.gate.clear()
    worker = WindowWorker(config(redis_url, max_batch_size=4), model)
    task = await run_worker(worker)
    first = await aclient.enqueue("running", model="t")
    await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
    low = await aclient.enqueue_many([f"low{i}" for i in range(8)], model="t", priority=-5)
    # The next window (4 of the low ones) is claimed while the model is busy...
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: r.zcard(KEYS.inflight) == 5, 10, "the next window"))
    high = await aclient.enqueue("urgent", model="t", priority=50)
    model.gate.set()  # ...and when the device frees up, the urgent request goes first.
    assert (await high.result(timeout=10)).output == "URGENT"
    await asyncio.gather(*(h.result(timeout=10) for h in [first, *low]))
    await stop(worker, task)
    assert "urgent" in model.batches[1]
    assert sum(len(b) for b in model.batches) == 10  # nothing ran twice
    assert worker.stats.released == 1  # one low request went back, attempt not counted
