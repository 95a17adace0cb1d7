"""Failure handling in the worker: retries, dead letters, out of memory, isolation, deadlines,
and a Redis restart in the middle of a run."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

import inferq
from inferq.embedded import EmbeddedServer
from inferq.errors import DeviceOutOfMemory, InferqError
from inferq.protocol import ops
from inferq.protocol.codec import RequestPayload
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.processes import wait_until
from tests.support.window_worker import KEYS, config, run_worker, stop


class FaultyModel(BatchModel):
    """Fails on purpose: 'flaky' fails its first attempt, 'poison' always fails, and a batch
    over ``oom_tokens`` padded tokens runs out of memory."""

    tasks = frozenset({"*"})

    def __init__(self, oom_tokens: int | None = None) -> None:
        self.model_id = "faulty"
        self.oom_tokens = oom_tokens
        self.calls: Counter[str] = Counter()
        self.batches: list[list[str]] = []
        self.ooms = 0
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        return [ModelInput(int(p.params.get("tokens", 4)), p.prompt)  # type: ignore[arg-type]
                for p in payloads]

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        self.started.set()
        self.gate.wait(timeout=30)
        texts = [item.data for item in batch]
        padded = len(batch) * max(item.tokens for item in batch)
        if self.oom_tokens is not None and padded > self.oom_tokens:
            self.ooms += 1
            raise DeviceOutOfMemory(f"{padded} padded tokens do not fit")
        self.batches.append(texts)
        for text in texts:
            self.calls[text] += 1
        if "poison" in texts:
            raise RuntimeError("poison")
        if "flaky" in texts and self.calls["flaky"] == 1:
            raise inferq.TransientError("first attempt fails")
        return [t.upper() for t in texts]


async def outcome(handle: inferq.AsyncHandle) -> tuple[str, Any, int]:
    try:
        result = await handle.result(timeout=30)
        return "ok", result.output, result.attempts
    except inferq.RequestError as exc:
        return exc.result.status.value, exc.result.error and exc.result.error.code, \
            exc.result.attempts


async def test_retryable_failures_retry_with_backoff_then_dead_letter(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    model = FaultyModel()
    worker = WindowWorker(config(redis_url, retry_base_ms=20, retry_max_ms=100), model)
    task = await run_worker(worker)
    flaky = await aclient.enqueue("flaky", model="t")
    assert await outcome(flaky) == ("ok", "FLAKY", 2)
    # one call: both are pending together, so the first window holds both
    poison, fine = await aclient.enqueue_many(
        [{"prompt": "poison", "max_attempts": 3}, {"prompt": "fine"}], model="t")
    assert await outcome(poison) == ("dead", "model_error", 3)
    assert await outcome(fine) == ("ok", "FINE", 1)
    await stop(worker, task)
    # 3 attempts; the first one also ran it once inside the shared batch before bisecting.
    assert model.calls["poison"] == 4
    assert r.zscore(KEYS.dead, poison.id) is not None
    assert int(r.hget(KEYS.stats, "retried") or 0) == 3  # flaky once, poison twice
    assert r.zcard(KEYS.delayed) == 0
    # the worker's own dead result fills the dead letter's record: its code, message, attempts
    letter = await aclient.dead_letters(model="t").show(poison.id)
    assert letter is not None and letter.requeueable
    assert (letter.error_code, letter.attempts, letter.prompt_head()) == ("model_error", 3,
                                                                         "poison")
    assert "poison" in letter.error_message


async def test_retried_request_runs_alone(redis_url: str, r: redis.Redis,
                                          aclient: inferq.AsyncClient) -> None:
    # A request lost with its worker while it ran alone is a suspect: it must not share a
    # batch, so it cannot take other requests down if it crashes a worker again.
    suspect = await aclient.enqueue("suspect", model="t", priority=9)
    scripts = ops.register(r)
    keys, args = ops.claim_call(KEYS, "crashed-worker", 30_000, 1, 60_000)
    (claimed,) = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
    keys, args = ops.start_call(KEYS, [(claimed.id, claimed.token)])
    assert scripts["start"](keys=keys, args=args) == []  # it ran when its worker died
    r.zadd(KEYS.inflight, {suspect.id: 0})
    keys, args = ops.reclaim_call(KEYS, 10, 60_000, 100)
    assert ops.parse_reclaim(scripts["reclaim"](keys=keys, args=args)).counts == (1, 0)
    others = await aclient.enqueue_many([f"o{i}" for i in range(6)], model="t")
    model = FaultyModel()
    worker = WindowWorker(config(redis_url), model)
    task = await run_worker(worker)
    assert await outcome(suspect) == ("ok", "SUSPECT", 1)  # a lost run is not an attempt
    for handle in others:
        assert (await outcome(handle))[0] == "ok"
    await stop(worker, task)
    assert ["suspect"] in model.batches
    assert all(len(b) == 1 for b in model.batches if "suspect" in b)
    assert max(len(b) for b in model.batches) > 1  # the others still batched together


async def test_out_of_memory_splits_the_batch_and_learns_a_budget(
        redis_url: str, aclient: inferq.AsyncClient) -> None:
    model = FaultyModel(oom_tokens=40)  # 10 rows of 8 tokens (80) do not fit; 5 rows do
    model.gate.clear()
    worker = WindowWorker(config(redis_url, max_batch_size=10, max_batch_tokens=None), model)
    task = await run_worker(worker)
    warm = await aclient.enqueue("warm", model="t")
    await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
    first = await aclient.enqueue_many(
        [{"prompt": f"a{i}", "params": {"tokens": 8}} for i in range(10)], model="t")
    model.gate.set()
    await outcome(warm)
    assert [await outcome(h) for h in first] == [("ok", f"A{i}", 1) for i in range(10)]
    ooms_after_first = model.ooms
    assert ooms_after_first >= 1 and worker.memory.ooms == ooms_after_first
    assert worker.memory.budget(8) is not None and worker.memory.budget(8) <= 40
    second = await aclient.enqueue_many(
        [{"prompt": f"b{i}", "params": {"tokens": 8}} for i in range(10)], model="t")
    assert [(await outcome(h))[0] for h in second] == ["ok"] * 10
    assert model.ooms == ooms_after_first  # the learned budget prevented new OOMs
    too_big = await aclient.enqueue("huge", model="t", params={"tokens": 64}, max_attempts=2)
    assert await outcome(too_big) == ("dead", "out_of_memory", 2)
    await stop(worker, task)


async def test_a_deadline_passing_in_the_window_expires_without_running(
        redis_url: str, r: redis.Redis, aclient: inferq.AsyncClient) -> None:
    model = FaultyModel()
    model.gate.clear()
    worker = WindowWorker(config(redis_url), model)
    task = await run_worker(worker)
    blocker = await aclient.enqueue("blocker", model="t")
    await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
    late = await aclient.enqueue("late", model="t", deadline_s=0.2)
    # It is claimed into the next window while the device is busy...
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: r.hget(KEYS.request(late.id), "st") == b"inflight",
                                 10, "the late request to be claimed"))
    await asyncio.sleep(0.3)  # ...and its deadline passes while it waits there
    model.gate.set()
    assert await outcome(late) == ("expired", "deadline_exceeded", 1)
    assert await outcome(blocker) == ("ok", "BLOCKER", 1)
    await stop(worker, task)
    assert "late" not in model.calls


async def test_worker_and_producer_ride_out_a_redis_restart(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    server.start()
    try:
        async with inferq.AsyncClient(server.url) as client:
            worker = WindowWorker(config(server.url, lease_ms=2_000), EchoModel())
            task = await run_worker(worker)
            before = await client.enqueue_many([f"b{i}" for i in range(20)], model="t")
            assert [(await h.result(timeout=10)).output for h in before] == \
                [f"b{i}" for i in range(20)]
            queued = await client.enqueue_many([f"q{i}" for i in range(20)], model="t")
            server.stop()  # AOF keeps whatever was accepted
            await asyncio.sleep(0.5)  # the worker sees connection errors meanwhile
            server.start()
            after = await client.enqueue_many([f"a{i}" for i in range(20)], model="t")
            outputs = {(await h.result(timeout=30)).output for h in queued + after}
            assert outputs == {f"q{i}" for i in range(20)} | {f"a{i}" for i in range(20)}
            assert not task.done()  # the worker did not crash
            await stop(worker, task)
    finally:
        server.stop()


def test_no_key_is_left_behind_but_unexpired_results(redis_url: str, r: redis.Redis) -> None:
    async def run() -> None:
        async with inferq.AsyncClient(redis_url) as client:
            worker = WindowWorker(config(redis_url), EchoModel())
            task = await run_worker(worker)
            handles = await client.enqueue_many([f"r{i}" for i in range(300)], model="t")
            cancelled = await client.enqueue("to cancel", model="t")
            await cancelled.cancel()
            for h in handles:
                await h.result(timeout=30)
            await stop(worker, task)

    asyncio.run(run())
    counts: Counter[str] = Counter()
    for key in r.scan_iter(count=1000):
        name = key.decode()
        kind = name.split("}:", 1)[1].split(":")[0] if "}:" in name else name
        counts[kind] += 1
        if kind in ("result", "inbox", "tuning", "window"):
            assert r.pttl(key) > 0, f"{name} has no TTL"
    assert counts["result"] == 301
    # Per-request state is gone; what remains is bounded bookkeeping, one key each.
    assert set(counts) <= {"result", "inbox", "tuning", "window", "stats", "seq", "workers", "fair",
                           "inferq:queues", "inferq:queues:requested"}
    assert all(n == 1 for kind, n in counts.items() if kind != "result")


async def test_worker_warns_when_the_server_could_lose_requests(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = EmbeddedServer(tmp_path / "volatile", appendonly=False)
    server.start()
    try:
        redis.Redis.from_url(server.url).config_set("maxmemory-policy", "allkeys-lru")
        worker = WindowWorker(config(server.url), EchoModel())
        with caplog.at_level("WARNING", logger="inferq.worker"):
            task = await run_worker(worker)
            async with inferq.AsyncClient(server.url) as client:
                await (await client.enqueue("x", model="t")).result(timeout=10)
            await stop(worker, task)
        text = caplog.text
        assert "maxmemory-policy is allkeys-lru" in text
        assert "persistence is off" in text
    finally:
        server.stop()
