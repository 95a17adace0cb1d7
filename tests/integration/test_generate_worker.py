"""The generate worker in-process against a real server: continuous batching through the queue,
streaming, cancellation, priorities, validation."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import msgpack
import pytest
import redis

import inferq
from inferq.cli.stats import format_stats
from inferq.protocol.codec import RequestPayload
from inferq.protocol.keys import QueueKeys
from inferq.stats import read_all
from inferq.worker.models.lm import CausalLM
from tests.support.generation import MODEL, WORDS, greedy_reference
from tests.support.metrics import health, scrape

KEYS = QueueKeys.for_model("generate", MODEL)


def text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


async def until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def test_greedy_through_the_queue_equals_generate_alone(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM) -> None:
    rng = random.Random(4)
    specs = [(text(rng, 1, 60), rng.randint(4, 48)) for _ in range(20)]
    worker = await gen_worker(max_slots=8)
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": n}} for p, n in specs],
        model=MODEL, task="generate")
    results = [await h.result(timeout=60) for h in handles]
    for (prompt, n), result in zip(specs, results, strict=True):
        ids = lm.tokenizer(prompt)["input_ids"]
        assert result.output["token_ids"] == greedy_reference(lm, ids, n)
        assert result.usage is not None and result.usage.prompt_tokens == len(ids)
        assert result.usage.completion_tokens == len(result.output["token_ids"])
        assert result.finish_reason in (inferq.FinishReason.STOP, inferq.FinishReason.LENGTH)
        assert result.ttft_ms is not None and 0 <= result.ttft_ms <= result.total_ms
    assert worker.stats.max_batch > 1  # they did share decode steps
    assert max(r.batch_size or 0 for r in results) > 1


async def test_a_request_joins_a_running_batch_mid_generation(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    # A stream write per step, so "20 entries" means 20 decode steps however fast the CPU; the
    # long one then has ~1,000 steps left while the short one needs 6.
    await gen_worker(max_slots=4, stream_interval_ms=0)
    long = await aclient.enqueue("a long story", model=MODEL, task="generate",
                                 params={"max_new_tokens": 1000, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(long.id)) >= 20, what="the long generation")
    short = await aclient.enqueue("quick", model=MODEL, task="generate",
                                  params={"max_new_tokens": 5, "ignore_eos": True})
    short_result = await short.result(timeout=30)
    long_result = await long.result(timeout=60)
    assert short_result.finished_ms is not None and long_result.finished_ms is not None
    assert short_result.finished_ms < long_result.finished_ms
    # It started at step granularity: its first token came long before the long one ended.
    assert short_result.enqueued_ms is not None and short_result.ttft_ms is not None
    assert short_result.enqueued_ms + short_result.ttft_ms < long_result.finished_ms
    assert short_result.batch_size == 2
    assert long_result.usage is not None and long_result.usage.completion_tokens == 1000


async def test_without_preemption_high_priority_takes_the_next_free_slot_ahead_of_the_backlog(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    # A stream write per step; the running pair is long enough to still run when the backlog
    # and the urgent request arrive, however fast the CPU. (With preemption, the default, the
    # urgent request takes a running slot at once: test_generate_preemption.)
    await gen_worker(max_slots=2, stream_interval_ms=0, max_preemptions=0)
    running = [await aclient.enqueue(f"run {i}", model=MODEL, task="generate",
                                     params={"max_new_tokens": 200 + 100 * i, "ignore_eos": True})
               for i in range(2)]
    await until(lambda: all(r.xlen(KEYS.stream(h.id)) >= 2 for h in running),
                what="a full running batch")
    backlog = await aclient.enqueue_many(
        [{"prompt": f"backlog {i}", "params": {"max_new_tokens": 20, "ignore_eos": True}}
         for i in range(4)], model=MODEL, task="generate")
    urgent = await aclient.enqueue("urgent", model=MODEL, task="generate", priority=50,
                                   params={"max_new_tokens": 20, "ignore_eos": True})
    assert r.zcard(KEYS.pending) == 5  # the backlog waits in Redis, not in the worker
    urgent_result = await urgent.result(timeout=60)
    backlog_results = [await h.result(timeout=60) for h in backlog]
    first_running_end = min([(await h.result(timeout=60)).finished_ms or 0 for h in running])
    assert urgent_result.started_ms is not None
    assert urgent_result.started_ms >= first_running_end - 50  # it waited for a free slot
    assert all(urgent_result.started_ms <= (b.started_ms or 0) for b in backlog_results)
    assert all(urgent_result.ttft_ms is not None and b.ttft_ms is not None
               and urgent_result.enqueued_ms is not None and b.enqueued_ms is not None
               and urgent_result.enqueued_ms + urgent_result.ttft_ms
               < b.enqueued_ms + b.ttft_ms for b in backlog_results)


async def test_stream_deltas_concatenate_to_the_final_text_and_replay_from_the_start(
        gen_worker: Any, aclient: inferq.AsyncClient, redis_url: str) -> None:
    await gen_worker(stream_interval_ms=0)  # a write per step: many deltas, even on a fast CPU
    handle = await aclient.enqueue("tell me about the queue", model=MODEL, task="generate",
                                   params={"max_new_tokens": 60, "ignore_eos": True})
    items = [item async for item in handle.stream(timeout=30)]
    *deltas, final = items
    assert isinstance(final, inferq.Result) and final.ok
    assert all(isinstance(d, str) and d for d in deltas) and len(deltas) > 5
    assert "".join(deltas) == final.output["text"]
    # A client that reconnects (here: a sync client in another thread) reads it all again.
    def replay() -> list[Any]:
        with inferq.Client(redis_url) as sync_client:
            return list(sync_client.handle(handle.id, model=MODEL, task="generate").stream(
                timeout=10))
    again = await asyncio.get_running_loop().run_in_executor(None, replay)
    assert again[:-1] == deltas and again[-1] == final


async def test_cancel_stops_a_long_generation_within_a_step_and_frees_its_slot(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=2)
    handle = await aclient.enqueue("never ending", model=MODEL, task="generate",
                                   params={"max_new_tokens": 1000, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(handle.id)) >= 10, what="tokens")
    assert await handle.cancel()
    entries_at_cancel = r.xlen(KEYS.stream(handle.id))
    await until(lambda: not worker.running, timeout=10, what="the slot to be freed")
    with pytest.raises(inferq.RequestCancelled) as info:
        await handle.result(timeout=5)
    assert info.value.result.finish_reason is inferq.FinishReason.CANCELLED
    items = [item async for item in handle.stream(timeout=10)]
    final = items[-1]
    assert isinstance(final, inferq.Result) and final.status is inferq.Status.CANCELLED
    # Nothing was appended after the cancel but the end marker.
    tail = r.xrange(KEYS.stream(handle.id))[entries_at_cancel:]
    assert all(b"d" not in fields for _, fields in tail)
    assert len("".join(i for i in items if isinstance(i, str))) < 1000
    assert worker.stats.cancelled == 1
    # It left at the first step boundary after the notice reached the step loop.
    assert list(worker.steps.cancel_lags) and max(worker.steps.cancel_lags) <= 1
    # The worker is free for the next request.
    after = await aclient.enqueue("next", model=MODEL, task="generate",
                                  params={"max_new_tokens": 3})
    assert (await after.result(timeout=30)).ok


async def test_cancel_reaches_the_running_generation_without_waiting_for_a_stream_write(
        gen_worker: Any, aclient: inferq.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stream writes (which also report lost leases) once a second: only the cancel notice
    # pushed to the worker can stop the generation within a few steps.
    worker = await gen_worker(max_slots=2, stream_interval_ms=1000)
    # Steps of at least 3 ms, as a real model's: on a fast CPU the tiny model steps in well
    # under a millisecond, and "a few steps" would be a race with the cancel's round trips.
    step = worker.engine.step

    def paced_step(admitted: list[Any]) -> list[Any]:
        time.sleep(0.003)
        return step(admitted)

    monkeypatch.setattr(worker.engine, "step", paced_step)
    handle = await aclient.enqueue("stop me", model=MODEL, task="generate",
                                   params={"max_new_tokens": 3000, "ignore_eos": True})
    await until(lambda: worker.running and len(worker.running[0].tokens) >= 20,
                what="the generation to run")
    g = worker.running[0]
    at_cancel = len(g.tokens)
    assert await handle.cancel()
    await until(lambda: g.finish is inferq.FinishReason.CANCELLED, timeout=10,
                what="the generation to leave the batch")
    # The decode step in flight when the notice arrived, and the cancel's round trips.
    assert len(g.tokens) - at_cancel <= 8, len(g.tokens) - at_cancel
    await until(lambda: worker.stats.cancelled == 1, what="the worker to count it")


async def test_chat_messages_use_the_chat_template(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM) -> None:
    await gen_worker()
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of France?"}]
    result = await (await aclient.enqueue(messages=messages, model=MODEL, task="generate",
                                          params={"max_new_tokens": 16})).result(timeout=30)
    rendered = lm.tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    ids = lm.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert result.input_tokens == len(ids)
    assert result.output["token_ids"] == greedy_reference(lm, ids, 16)


async def test_sampling_with_a_seed_is_reproducible_through_the_queue(
        gen_worker: Any, aclient: inferq.AsyncClient) -> None:
    await gen_worker()
    params = {"max_new_tokens": 24, "temperature": 0.8, "top_k": 50, "top_p": 0.9,
              "seed": 1234, "ignore_eos": True}
    first = await (await aclient.enqueue("sample me", model=MODEL, task="generate",
                                         params=params)).result(timeout=30)
    noise = await aclient.enqueue_many([f"other {i}" for i in range(5)], model=MODEL,
                                       task="generate", params={"max_new_tokens": 10})
    second = await (await aclient.enqueue("sample me", model=MODEL, task="generate",
                                          params=params)).result(timeout=30)
    for h in noise:
        await h.result(timeout=30)
    assert first.output["token_ids"] == second.output["token_ids"]


async def test_bad_params_fail_at_enqueue_and_in_the_worker(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    with pytest.raises(inferq.ValidationError, match="max_new_tokens"):
        await aclient.enqueue("x", model=MODEL, task="generate", params={"max_new_tokens": -1})
    with pytest.raises(inferq.ValidationError, match="temprature"):
        await aclient.enqueue("x", model=MODEL, task="generate", params={"temprature": 0.5})
    # A payload written by something other than the SDK is checked again by the worker.
    handle = await aclient.enqueue("x", model=MODEL, task="generate")
    payload = RequestPayload(id=handle.id, task="generate", model=MODEL, prompt="x",
                             params={"top_p": 7})
    r.hset(KEYS.request(handle.id), "p", msgpack.packb(payload.model_dump(exclude_none=True)))
    too_long = await aclient.enqueue("word " * 1100, model=MODEL, task="generate")
    await gen_worker()
    with pytest.raises(inferq.RequestFailed, match="top_p") as info:
        await handle.result(timeout=30)
    assert info.value.error_code == "invalid_request"
    with pytest.raises(inferq.RequestFailed, match="context") as info:
        await too_long.result(timeout=30)
    assert info.value.error_code == "invalid_input"


async def test_stop_strings_through_the_queue(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM) -> None:
    await gen_worker()
    prompt = "the capital of France"
    full = lm.decode(greedy_reference(lm, lm.tokenizer(prompt)["input_ids"], 30,
                                      ignore_eos=True))
    stop = full[8:11]
    handle = await aclient.enqueue(prompt, model=MODEL, task="generate",
                                   params={"max_new_tokens": 30, "stop": [stop],
                                           "ignore_eos": True})
    items = [i async for i in handle.stream(timeout=30)]
    final = items[-1]
    assert isinstance(final, inferq.Result)
    assert final.finish_reason is inferq.FinishReason.STOP
    assert final.output["text"] == full[:full.index(stop)]
    assert "".join(i for i in items if isinstance(i, str)) == final.output["text"]


async def test_shutdown_finishes_running_generations_and_gives_back_the_rest(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    worker = await gen_worker(max_slots=1, stream_interval_ms=0)
    first = await aclient.enqueue("first", model=MODEL, task="generate",
                                  params={"max_new_tokens": 300, "ignore_eos": True})
    await until(lambda: r.xlen(KEYS.stream(first.id)) >= 2, what="first running")
    rest = await aclient.enqueue_many(["a", "b"], model=MODEL, task="generate")
    worker.request_stop()
    assert (await first.result(timeout=30)).usage.completion_tokens == 300  # type: ignore[union-attr]
    await until(lambda: r.zcard(KEYS.inflight) == 0, what="claims given back")
    assert r.zcard(KEYS.pending) == 2
    for h in rest:
        assert r.hget(KEYS.request(h.id), "a") == b"0"


async def test_the_worker_survives_a_flushed_script_cache(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    await gen_worker()
    first = await aclient.enqueue("one", model=MODEL, task="generate",
                                  params={"max_new_tokens": 4})
    assert (await first.result(timeout=30)).ok
    r.script_flush()  # as after a server restart: the publisher's EVALSHA must reload
    second = await aclient.enqueue("two", model=MODEL, task="generate",
                                   params={"max_new_tokens": 4})
    items = [i async for i in second.stream(timeout=30)]
    assert isinstance(items[-1], inferq.Result) and items[-1].ok
    assert "".join(i for i in items if isinstance(i, str)) == items[-1].output["text"]


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "engine-process"])
async def test_generate_worker_exports_metrics_and_health(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis,
        engine_process: bool) -> None:
    # The same with the model in an engine process: the worker process counts what it reads.
    worker = await gen_worker({"metrics_port": 0, "lease_ms": 1_000}, max_slots=4,
                              engine_process=engine_process)
    handles = await aclient.enqueue_many(
        [{"prompt": f"count {i}", "priority": 5 if i % 2 else 0,
          "params": {"max_new_tokens": 6 + i, "ignore_eos": True}} for i in range(8)],
        model=MODEL, task="generate")
    results = [await h.result(timeout=60) for h in handles]
    assert worker.metrics_server is not None
    port = worker.metrics_server.server_address[1]
    loop = asyncio.get_running_loop()
    await until(lambda: worker.health.report()[0], what="healthz to report ok")
    status, detail = await loop.run_in_executor(None, health, port)
    assert status == 200 and detail["worker"] == "gen-worker" and "running" in detail
    samples = await loop.run_in_executor(None, scrape, port)
    q = f"queue=generate:{MODEL}"
    generated = sum(r.usage.completion_tokens for r in results if r.usage)
    assert samples[f"inferq_requests_total{{{q},status=ok}}"] == 8
    assert samples[f"inferq_generated_tokens_total{{{q}}}"] == generated
    prompts = sum(r.usage.prompt_tokens for r in results if r.usage)
    assert samples[f"inferq_tokens_total{{{q}}}"] == generated + prompts
    assert samples[f"inferq_batch_size_count{{{q}}}"] == worker.stats.steps
    assert samples[f"inferq_forward_seconds_count{{{q}}}"] == worker.stats.steps
    for priority in ("0", "5"):
        assert samples[f"inferq_time_to_first_token_seconds_count{{priority={priority},{q}}}"
                       ] == 4
        assert samples[f"inferq_queue_wait_seconds_count{{priority={priority},{q}}}"] == 4
        assert samples[f"inferq_claim_to_result_seconds_count{{priority={priority},{q}}}"
                       ] == 4
    assert samples[f"inferq_target_batch_size{{{q}}}"] == 4
    assert samples[f"inferq_live_workers{{{q}}}"] == 1
    # `inferq stats` shows the running batch and the steps, not a window it does not have.
    await until(lambda: r.hget(KEYS.window("gen-worker"), "requests") == b"8",
                what="the stats hash to be published")
    published = r.hgetall(KEYS.window("gen-worker"))
    assert (published[b"running"], published[b"waiting"], published[b"max_slots"]) == (
        b"0", b"0", b"4")
    line = format_stats(read_all(r, [KEYS.queue])).splitlines()[-1]
    assert line.startswith("  worker gen-worker: continuous batching, running 0 of 4 slots, "
                           "0 claimed and waiting")
    assert f"steps {worker.stats.steps} ({worker.stats.admission_steps} admitting)" in line
    assert f"tokens {generated} generated + {prompts} prefilled" in line
    assert "'length': 8" in line
    assert 0 < worker.stats.admission_steps < worker.stats.steps


async def test_a_request_that_breaks_the_model_fails_alone_through_the_queue(
        gen_worker: Any, aclient: inferq.AsyncClient, lm: CausalLM,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = await gen_worker(max_slots=8)
    poison = "the poison pill"
    poison_ids = lm.tokenizer(poison)["input_ids"]
    real = worker.engine._prefill

    def prefill(admitted: list[Any]) -> None:
        if any(g.prompt_ids == poison_ids for g in admitted):
            raise RuntimeError("this input breaks the model")
        real(admitted)

    monkeypatch.setattr(worker.engine, "_prefill", prefill)
    rng = random.Random(8)
    prompts = [text(rng, 2, 20) for _ in range(7)]
    prompts.insert(3, poison)
    handles = await aclient.enqueue_many(
        [{"prompt": p, "max_attempts": 1, "params": {"max_new_tokens": 12}} for p in prompts],
        model=MODEL, task="generate")
    outcomes = await asyncio.gather(*(h.result(timeout=60) for h in handles),
                                    return_exceptions=True)
    for prompt, outcome in zip(prompts, outcomes, strict=True):
        if prompt == poison:
            assert isinstance(outcome, inferq.RequestFailed), outcome
            assert "breaks the model" in str(outcome)
        else:
            assert isinstance(outcome, inferq.Result) and outcome.ok
            ids = lm.tokenizer(prompt)["input_ids"]
            assert outcome.output["token_ids"] == greedy_reference(lm, ids, 12)
