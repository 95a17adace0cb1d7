"""Priority on the device: a waiting generation of strictly higher priority takes the slot of
the lowest running one, which keeps its tokens, resumes later and never loses an attempt; equal
or lower priorities wait in Redis; a full worker watches the head of pending. In both modes
(step loop on a thread, and in the engine process)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

import inferq
from inferq.cli.stats import format_stats
from inferq.protocol.keys import QueueKeys
from inferq.stats import read_all
from inferq.worker.models.lm import CausalLM
from tests.support.generation import MODEL, greedy_reference

KEYS = QueueKeys.for_model("generate", MODEL)
MODES = pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])


async def until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def collect(handle: inferq.AsyncHandle) -> list[Any]:
    return [item async for item in handle.stream(timeout=120)]


def preemptions(worker: Any) -> float:
    value = worker.metrics.registry.get_sample_value(
        "inferq_preemptions_total", {"queue": KEYS.queue, "reason": "priority"})
    return value or 0.0


@MODES
async def test_a_higher_priority_request_preempts_the_lowest_running_generation(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM, r: redis.Redis,
        engine_process: bool) -> None:
    worker = await gen_worker(max_slots=2, engine_process=engine_process)
    await until(lambda: worker.budget_known, what="the engine")
    lows = [await aclient.enqueue(f"low {i} the queue", model=MODEL, task="generate",
                                  priority=-10, params={"max_new_tokens": 300, "ignore_eos": True})
            for i in range(2)]
    streams = [asyncio.create_task(collect(h)) for h in lows]
    await until(lambda: all(r.xlen(KEYS.stream(h.id)) >= 2 for h in lows),
                what="a full running batch")
    backlog = await aclient.enqueue_many(
        [{"prompt": f"backlog {i}", "priority": -10,
          "params": {"max_new_tokens": 8, "ignore_eos": True}} for i in range(3)],
        model=MODEL, task="generate")
    urgent = await aclient.enqueue("urgent", model=MODEL, task="generate", priority=50,
                                   params={"max_new_tokens": 16, "ignore_eos": True})
    urgent_result = await urgent.result(timeout=60)
    low_results = [await h.result(timeout=120) for h in lows]
    backlog_results = [await h.result(timeout=120) for h in backlog]
    # It did not wait for a slot to free: it took one.
    assert urgent_result.ok and urgent_result.finished_ms is not None
    assert all(urgent_result.finished_ms < (low.finished_ms or 0) for low in low_results)
    # Equal priorities do not preempt: the backlog waited (in Redis) for a free slot.
    assert all((b.started_ms or 0) >= urgent_result.finished_ms - 50 for b in backlog_results)
    assert preemptions(worker) == 1 and worker.stats.preemptions == 1
    # The preempted generation kept every token: its stream is its text, its tokens are those
    # of ``generate`` alone, and the preemption was not an attempt.
    for handle, result, stream in zip(lows, low_results, streams, strict=True):
        *deltas, final = await stream
        assert final == result and result.ok and result.attempts == 1
        assert "".join(deltas) == result.output["text"]
        ids = lm.tokenizer(f"low {lows.index(handle)} the queue")["input_ids"]
        assert result.output["token_ids"] == greedy_reference(lm, ids, 300, ignore_eos=True)
        assert result.usage is not None and result.usage.completion_tokens == 300
        assert r.hget(KEYS.request(handle.id), "a") in (None, b"1")
    await until(lambda: r.hget(KEYS.window("gen-worker"), "preemptions") == b"1",
                what="the stats hash")
    assert "preemptions 1," in format_stats(read_all(r, [KEYS.queue]))


async def test_equal_or_lower_priorities_wait_in_redis_while_the_device_is_full(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=2)
    running = [await aclient.enqueue(f"run {i}", model=MODEL, task="generate",
                                     params={"max_new_tokens": 400, "ignore_eos": True})
               for i in range(2)]
    await until(lambda: all(r.xlen(KEYS.stream(h.id)) >= 2 for h in running),
                what="a full running batch")
    same = await aclient.enqueue("same", model=MODEL, task="generate", priority=0,
                                 params={"max_new_tokens": 4})
    lower = await aclient.enqueue("lower", model=MODEL, task="generate", priority=-5,
                                  params={"max_new_tokens": 4})
    reads = worker.stats.head_reads
    await until(lambda: worker.stats.head_reads >= reads + 3, what="the worker to watch pending")
    assert r.zcard(KEYS.pending) == 2 and worker.stats.preemptions == 0
    assert all(g.id in {h.id for h in running} for g in worker.running)
    for h in (same, lower):
        assert (await h.result(timeout=120)).ok
    assert preemptions(worker) == 0


async def test_with_preemption_off_a_full_worker_does_not_watch_pending(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=1, max_preemptions=0)
    running = await aclient.enqueue("run", model=MODEL, task="generate",
                                    params={"max_new_tokens": 200, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(running.id)) >= 2, what="the running generation")
    urgent = await aclient.enqueue("urgent", model=MODEL, task="generate", priority=50,
                                   params={"max_new_tokens": 4})
    result, urgent_result = await running.result(timeout=60), await urgent.result(timeout=60)
    assert (urgent_result.started_ms or 0) >= (result.finished_ms or 0) - 50
    assert worker.stats.head_reads == 0 and worker.stats.preemptions == 0


@MODES
async def test_a_sequence_is_preempted_at_most_max_preemptions_times(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis,
        engine_process: bool) -> None:
    worker = await gen_worker(max_slots=1, max_preemptions=1, engine_process=engine_process)
    await until(lambda: worker.budget_known, what="the engine")
    low = await aclient.enqueue("low", model=MODEL, task="generate", priority=-10,
                                params={"max_new_tokens": 400, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(low.id)) >= 2, what="the low generation")
    first = await aclient.enqueue("first", model=MODEL, task="generate", priority=50,
                                  params={"max_new_tokens": 8, "ignore_eos": True})
    assert (await first.result(timeout=60)).ok
    await until(lambda: any(g.id == low.id for g in worker.running), what="the resume")
    # Once preempted, the low generation keeps its slot: the next urgent request waits.
    second = await aclient.enqueue("second", model=MODEL, task="generate", priority=50,
                                   params={"max_new_tokens": 8, "ignore_eos": True})
    low_result, second_result = await low.result(timeout=120), await second.result(timeout=60)
    assert low_result.ok and low_result.attempts == 1
    assert (second_result.started_ms or 0) >= (low_result.finished_ms or 0) - 50
    assert preemptions(worker) == 1
