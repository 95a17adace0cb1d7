"""The generate worker after a crash: a worker process is killed with SIGKILL while it holds
several generations; the next worker runs each reclaimed one (a run lost with its worker is not
an attempt; a generation lost alone runs alone) and goes on from the tokens already in its
stream."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import msgpack
import redis

import inferq
from inferq.protocol.keys import QueueKeys
from inferq.worker.generate.publisher import streamed
from inferq.worker.models.lm import CausalLM
from tests.support.generation import MODEL, greedy_reference
from tests.support.processes import WorkerProcess, wait_until

KEYS = QueueKeys.for_model("generate", MODEL)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def kill_mid_generation(redis_url: str, r: redis.Redis, tiny_path: Path, log_dir: Path,
                        ids: list[str], *, slots: int, entries: int = 5) -> set[str]:
    """Run an ``inferq worker`` process until each of ``ids`` streamed ``entries`` writes,
    then SIGKILL it; returns the ids it held in flight."""
    doomed = WorkerProcess(redis_url, "--task", "generate", "--model", f"{MODEL}={tiny_path}",
                           "--device", "cpu", "--lease-ms", "1500", "--worker-id", "doomed",
                           "--max-slots", str(slots), "--stream-interval-ms", "0",
                           log_dir=log_dir)
    try:
        wait_until(lambda: all(r.xlen(KEYS.stream(i)) >= entries for i in ids), 120,
                   f"the doomed worker to stream {entries} writes for each request")
        held = {m.decode() for m in r.zrange(KEYS.inflight, 0, -1)}
        # The weights load in the engine process only (the default); each process says what
        # it loaded.
        log = doomed.log
        assert f"loaded the tokenizer and config of {MODEL} in " in log, log
        assert "the engine process loads the weights" in log
        assert f"loaded model {MODEL} (weights) on cpu in " in log
        engines = children(doomed.proc.pid)
        assert engines, "the worker runs its model in an engine process"
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(timeout=10)
        # Its pipe closed with the worker: the engine process ends too, nothing is orphaned.
        wait_until(lambda: not any(running(pid) for pid in engines), 30,
                   "the killed worker's engine process to exit")
    finally:
        doomed.stop()
    return held


async def test_reclaimed_generations_go_on_after_a_sigkill_without_using_an_attempt(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis, redis_url: str,
        lm: CausalLM, tiny_path: Path, tmp_path: Path) -> None:
    prompts = [f"crash story {i}" for i in range(4)]
    new_tokens = 200
    handles = await aclient.enqueue_many(
        [{"prompt": p, "params": {"max_new_tokens": new_tokens, "ignore_eos": True}}
         for p in prompts], model=MODEL, task="generate")
    held = await asyncio.to_thread(kill_mid_generation, redis_url, r, tiny_path, tmp_path,
                                   [h.id for h in handles], slots=4)
    assert len(held) >= 2, held  # several generations were in flight together
    worker = await gen_worker(max_slots=8)
    results = [await h.result(timeout=120) for h in handles]
    for prompt, result in zip(prompts, results, strict=True):
        ids = lm.tokenizer(prompt)["input_ids"]
        assert result.output["token_ids"] == greedy_reference(lm, ids, new_tokens,
                                                              ignore_eos=True)
        if result.id in held:
            assert result.attempts == 1 and result.lost_runs == 1
            assert result.worker == "gen-worker"
    # The new worker ran the reclaimed requests, and only those.
    assert sum(worker.stats.reasons.values()) == len(held)


async def test_a_reclaimed_generation_goes_on_from_its_streamed_tokens(
        gen_worker: Any, aclient: inferq.AsyncClient, r: redis.Redis, redis_url: str,
        lm: CausalLM, tiny_path: Path, tmp_path: Path) -> None:
    new_tokens = 200
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0, "seed": 1}
    handle = await aclient.enqueue("resume me", model=MODEL, task="generate", params=params)
    held = await asyncio.to_thread(kill_mid_generation, redis_url, r, tiny_path, tmp_path,
                                   [handle.id], slots=2)
    assert held == {handle.id}
    key = KEYS.stream(handle.id)
    before = r.xrange(key)
    tokens_before, text_before = streamed(before)
    assert 0 < len(tokens_before) < new_tokens
    # The next attempt samples differently on purpose (another seed): generating again from
    # the prompt would contradict what the stream already showed.
    payload = msgpack.unpackb(r.hget(KEYS.request(handle.id), "p"))
    payload["params"]["seed"] = 2
    r.hset(KEYS.request(handle.id), "p", msgpack.packb(payload))
    worker = await gen_worker()
    items = [item async for item in handle.stream(timeout=60)]
    *deltas, final = items
    assert isinstance(final, inferq.Result) and final.ok
    assert (final.attempts, final.lost_runs) == (1, 1)  # lost with its worker: not an attempt
    after = r.xrange(key)
    assert after[:len(before)] == before  # nothing streamed was changed
    tokens_after, text_after = streamed(after)
    assert tokens_after[:len(tokens_before)] == tokens_before
    assert final.output["token_ids"] == tokens_after
    assert len(tokens_after) == new_tokens  # not regenerated: max_new_tokens in all
    assert final.usage is not None and final.usage.completion_tokens == new_tokens
    assert "".join(deltas) == text_after == final.output["text"]
    assert final.output["text"].startswith(text_before)
    assert final.output["text"] == lm.decode(tokens_after)
    # It prefilled its prompt and the streamed tokens once, instead of generating them again.
    prompt_tokens = len(lm.tokenizer("resume me")["input_ids"])
    assert worker.stats.prefill_tokens == prompt_tokens + len(tokens_before)
    # The new seed really samples other tokens from the prompt on.
    fresh = await (await aclient.enqueue("resume me", model=MODEL, task="generate",
                                         params={**params, "seed": 2})).result(timeout=60)
    assert fresh.output["token_ids"][:len(tokens_before)] != tokens_before
