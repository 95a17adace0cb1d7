"""The generate worker with its engine (model, KV cache, step loop) in a child process: the
worker process holds no weights, the engine process sizes the budget; the same tokens as
``generate``, streams, cancellation, a killed engine process, a clean drain."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
from typing import Any

import pytest
import redis
import torch

import inferq
from inferq.protocol.keys import QueueKeys, queues_registry
from inferq.worker.generate import wire
from inferq.worker.generate.engine_client import EngineProcess
from inferq.worker.generate.settings import GenerationSettings
from inferq.worker.models.lm import CausalLM, WeightsNotLoaded
from tests.support.generation import MODEL, WORDS, greedy_reference

KEYS = QueueKeys.for_model("generate", MODEL)


async def until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def collect(handle: inferq.AsyncHandle) -> list[Any]:
    return [item async for item in handle.stream(timeout=120)]


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead
        return stat.read().split(") ")[1][0] != "Z"


async def test_engine_process_tokens_equal_generate_and_streams_match(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM, r: redis.Redis) -> None:
    rng = random.Random(11)
    specs = [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))),
              rng.randint(4, 40)) for _ in range(12)]
    worker = await gen_worker(max_slots=6, engine_process=True)
    # The worker process tokenizes with a weightless CausalLM: the weights are in the engine.
    assert not worker.lm.has_weights
    assert not any(isinstance(v, torch.nn.Module) for v in vars(worker.lm).values())
    with pytest.raises(WeightsNotLoaded):
        worker.lm.model  # noqa: B018
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": n}} for p, n in specs],
        model=MODEL, task="generate")
    streams = await asyncio.gather(*(collect(h) for h in handles))
    for (prompt, n), items in zip(specs, streams, strict=True):
        *deltas, result = items
        assert isinstance(result, inferq.Result) and result.ok
        ids = lm.tokenizer(prompt)["input_ids"]
        assert result.output["token_ids"] == greedy_reference(lm, ids, n)
        assert "".join(deltas) == result.output["text"]
        assert result.usage is not None and result.usage.prompt_tokens == len(ids)
    assert worker.stats.max_batch > 1  # they shared decode steps, in the engine process
    assert worker.steps.pid != os.getpid()
    generated = sum(len(items[-1].output["token_ids"]) for items in streams)
    assert worker.stats.tokens == generated
    await until(lambda: r.hget(KEYS.window("gen-worker"), "requests") == b"12",
                what="the stats hash")
    assert r.hget(KEYS.window("gen-worker"), "tokens") == str(generated).encode()
    # The budget the engine process sized (on the CPU as a thread would: 1024 MiB) is the one
    # the worker checks requests against and publishes.
    budget = GenerationSettings(max_slots=6).budget(lm)
    assert worker.steps.budget == worker.budget == worker.engine.budget == budget
    published = r.hgetall(KEYS.window("gen-worker"))
    assert (published[b"max_slots"], published[b"kv_tokens"]) == (
        b"6", str(budget.kv_tokens).encode())


async def test_the_worker_is_advertised_only_once_its_engine_process_is_ready(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker's reader holds the engine's ``ready`` (the weights are loaded, the budget
    # sized) until released: meanwhile the worker is not live, its queue not registered (the
    # gateway's /v1/models), nothing is claimed and no stats are published.
    arrived, release = threading.Event(), threading.Event()
    real = EngineProcess._on_ready

    def held(self: EngineProcess, message: wire.Ready) -> None:
        arrived.set()
        release.wait(60)
        real(self, message)

    monkeypatch.setattr(EngineProcess, "_on_ready", held)
    worker = await gen_worker(max_slots=3, kv_cache_mb=4, engine_process=True)
    try:
        request = await aclient.enqueue("wait for the budget", model=MODEL, task="generate",
                                        params={"max_new_tokens": 4})
        await asyncio.to_thread(arrived.wait, 120)
        assert worker.steps.capacity() == 0 and not worker.budget_known
        assert not worker.serving.is_set()
        assert r.zscore(KEYS.workers, "gen-worker") is None
        assert not r.sismember(queues_registry(), KEYS.queue)
        assert KEYS.queue not in await aclient.served_queues()
        assert r.zcard(KEYS.pending) == 1 and r.zcard(KEYS.inflight) == 0
        assert not r.exists(KEYS.window("gen-worker"))
        gauge = worker.metrics.registry.get_sample_value(
            "inferq_target_batch_size", {"queue": KEYS.queue})
        assert not gauge
    finally:
        release.set()
    assert (await request.result(timeout=60)).ok
    assert r.zscore(KEYS.workers, "gen-worker") is not None
    assert r.sismember(queues_registry(), KEYS.queue)
    budget = GenerationSettings(max_slots=3, kv_cache_mb=4).budget(lm)
    assert budget.kv_tokens == 4 * 2**20 // lm.kv.bytes_per_token
    assert worker.steps.budget == worker.budget == worker.engine.budget == budget
    assert worker.publisher.max_slots == 3
    await until(lambda: r.hget(KEYS.window("gen-worker"), "kv_tokens")
                == str(budget.kv_tokens).encode(), what="the budget to be published")
    assert r.hget(KEYS.window("gen-worker"), "max_slots") == b"3"
    assert worker.metrics.registry.get_sample_value(
        "inferq_target_batch_size", {"queue": KEYS.queue}) == 3


async def test_a_fresh_workers_first_burst_starts_at_once(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    # A client that waits for the worker to be live (as one that waits for /v1/models) and
    # then sends a full burst: every stream's first token comes within the first steps, not
    # after the engine's load (which the worker waited out before it registered).
    slots = 6
    worker = await gen_worker(max_slots=slots, engine_process=True, stream_interval_ms=0)
    await until(lambda: r.zscore(KEYS.workers, "gen-worker") is not None, timeout=120,
                what="the worker to be live")
    assert worker.budget_known and worker.steps.capacity() == slots
    loop = asyncio.get_running_loop()
    sent = loop.time()
    handles = await aclient.enqueue_many(
        [{"prompt": f"first burst {i}", "params": {"max_new_tokens": 8, "ignore_eos": True}}
         for i in range(slots)], model=MODEL, task="generate")

    async def first_token(handle: inferq.AsyncHandle) -> float:
        async for _ in handle.stream(timeout=60):
            return loop.time() - sent
        raise AssertionError("a stream without a token")

    ttfts = await asyncio.gather(*(first_token(h) for h in handles))
    results = [await h.result(timeout=60) for h in handles]
    # One batch: admitted together at the engine's first step boundary (a generous wall bound
    # too: the engine's load took seconds, a tiny model's first steps take milliseconds).
    assert all(res.ok and res.batch_size == slots for res in results), [
        res.batch_size for res in results]
    assert max(ttfts) < 10.0, ttfts
    assert worker.steps.step <= 8 + 2


async def test_cancel_reaches_the_engine_process_and_frees_the_slot(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=2, engine_process=True)
    handle = await aclient.enqueue("never ending", model=MODEL, task="generate",
                                   params={"max_new_tokens": 1000, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(handle.id)) >= 3, what="tokens")
    assert await handle.cancel()
    await until(lambda: worker.stats.cancelled == 1, what="the generation to leave")
    assert not worker.running and worker.steps.capacity() == 2
    with pytest.raises(inferq.RequestCancelled):
        await handle.result(timeout=10)
    after = await aclient.enqueue("next", model=MODEL, task="generate",
                                  params={"max_new_tokens": 3})
    assert (await after.result(timeout=30)).ok


async def test_a_killed_engine_process_is_noticed_restarted_and_its_work_retried(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM, r: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "inferq.worker")
    worker = await gen_worker(max_slots=4, engine_process=True, stream_interval_ms=0)
    prompts = [f"killed engine {i}" for i in range(3)]
    new_tokens = 500
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": new_tokens, "ignore_eos": True}}
         for p in prompts], model=MODEL, task="generate")
    await until(lambda: all(r.xlen(KEYS.stream(h.id)) >= 3 for h in handles),
                what="the generations to stream")
    pid = worker.steps.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    results = [await h.result(timeout=180) for h in handles]
    for prompt, result in zip(prompts, results, strict=True):
        ids = lm.tokenizer(prompt)["input_ids"]
        # Retried (each alone, from its streamed tokens) in the new engine process.
        assert result.attempts == 2 and result.batch_size == 1
        assert result.output["token_ids"] == greedy_reference(lm, ids, new_tokens,
                                                              ignore_eos=True)
    assert worker.stats.engine_restarts == 1
    # The new engine process sized its budget and sent it again; the worker adopted it.
    assert sum("(sized by the engine process)" in m for m in caplog.messages) == 2
    assert worker.steps.budget == worker.budget
    assert worker.steps.pid != pid and alive(worker.steps.pid) and not alive(pid)
    assert any("engine process killed by signal SIGKILL" in m for m in caplog.messages)
    assert int(r.hget(KEYS.stats, "retried") or 0) == 3


async def test_sigterm_drain_finishes_running_generations_and_stops_the_engine(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=1, engine_process=True, stream_interval_ms=0)
    first = await aclient.enqueue("first", model=MODEL, task="generate",
                                  params={"max_new_tokens": 300, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(first.id)) >= 2, what="first running")
    rest = await aclient.enqueue_many(["a", "b"], model=MODEL, task="generate")
    pid = worker.steps.pid
    worker.request_stop()
    result = await first.result(timeout=60)
    assert result.usage is not None and result.usage.completion_tokens == 300
    await until(lambda: r.zcard(KEYS.inflight) == 0, what="claims given back")
    assert r.zcard(KEYS.pending) == 2
    for h in rest:
        assert r.hget(KEYS.request(h.id), "a") == b"0"
    await until(lambda: not alive(pid), what="the engine process to exit")


async def test_a_cancel_takes_effect_at_the_engines_next_step_boundary(
        gen_worker: Any, aclient: inferq.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine process is frozen (SIGSTOP) while the cancel travels through Redis to the
    # worker and down the pipe, so what is counted below is only what the engine did after
    # the notice reached it (its outputs from before the freeze were read meanwhile).
    # No stream interval: the engine's outbox sends every step, so the worker sees the tokens
    # as they come (paced at 1 s, the tiny model could finish all 1000 between two sends).
    worker = await gen_worker(max_slots=2, engine_process=True, stream_interval_ms=0)
    handle = await aclient.enqueue("stop me", model=MODEL, task="generate",
                                   params={"max_new_tokens": 1000, "ignore_eos": True})
    await until(lambda: worker.running and len(worker.running[0].tokens) >= 20,
                what="the generation to run")
    g = worker.running[0]
    pid = worker.steps.pid
    assert pid is not None
    sent = asyncio.Event()
    real_cancel = worker.steps.cancel

    def cancel(request_ids: list[str]) -> None:
        real_cancel(request_ids)
        sent.set()

    monkeypatch.setattr(worker.steps, "cancel", cancel)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert await handle.cancel()
        await asyncio.wait_for(sent.wait(), 30)
        # What the engine sent before the freeze may still be in the pipe: count it as before
        # the notice. Frozen, it sends nothing more; the reader's lock covers a message it is
        # applying.
        conn = worker.steps._conn
        await until(lambda: conn is None or not conn.poll(0), what="the pipe to be read")
        with worker.steps._lock:
            at_cancel = len(g.tokens)
    finally:
        os.kill(pid, signal.SIGCONT)
    await until(lambda: worker.stats.cancelled == 1, what="the generation to leave")
    assert g.finish is inferq.FinishReason.CANCELLED
    # In the engine: the cancellation left at the first step boundary after it arrived (the
    # step it arrived in, at most, ran on).
    assert list(worker.steps.cancel_lags) == [worker.steps.cancel_lags[0]]
    assert worker.steps.cancel_lags[0] <= 1
    # End to end, counted from the notice leaving the worker: that step, the one in flight
    # when frozen, and the steps the engine process ran after SIGCONT before its pipe reader
    # was scheduled (each ~1 ms on this model; a few on a loaded 2-CPU machine).
    assert len(g.tokens) - at_cancel <= 8, len(g.tokens) - at_cancel


async def test_device_memory_gauges_come_from_the_engine_process(redis_url: str) -> None:
    """With the model in the engine process, the worker's ``inferq_device_memory_bytes`` is
    what that process reports (the worker's own torch has no CUDA memory to read)."""
    import redis.asyncio as aioredis

    from inferq.worker.core.metrics import WorkerMetrics

    metrics = WorkerMetrics(KEYS.queue, "w1")
    metrics.device_memory_source = lambda: (123, 456)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await metrics.sample_queue(client, KEYS, "cuda:0")
    finally:
        await client.aclose()
    assert metrics.device_memory.labels(KEYS.queue, "allocated")._value.get() == 123
    assert metrics.device_memory.labels(KEYS.queue, "reserved")._value.get() == 456
