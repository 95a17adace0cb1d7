"""An async client's reply inbox carries the results themselves: no read per awaited result,
results popped before anyone waits are kept (within a byte budget), and an entry holding only
an id (as older scripts pushed) still resolves by reading the result."""

from __future__ import annotations

import asyncio

import pytest
import redis

import inferq
from inferq.producer import inbox as inbox_module
from inferq.protocol.codec import Result, Status, encode_result
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import KEYS, config, run_worker, stop


def lindex_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_lindex", {}).get("calls", 0))


async def results_written(r: redis.Redis, ids: list[str]) -> None:
    while sum(r.exists(KEYS.result(i)) for i in ids) < len(ids):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kept", [True, False])
async def test_results_come_with_the_inbox_or_are_read_when_not_kept(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, kept: bool) -> None:
    if not kept:  # a budget no result fits in
        monkeypatch.setattr(inbox_module, "ARRIVED_BYTES", 1)
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    async with inferq.AsyncClient(redis_url) as client:
        first = await client.enqueue("start the listener", model="t")
        await first.result(timeout=10)
        handles = await client.enqueue_many([f"r{i}" for i in range(200)], model="t")
        await asyncio.wait_for(results_written(r, [h.id for h in handles]), 30)
        # The listener pops them while no one waits for them: one waiter keeps it running.
        last = await handles[-1].result(timeout=10)
        before = lindex_calls(r)
        results = [await h.result(timeout=10) for h in handles[:-1]] + [last]
        reads = lindex_calls(r) - before
    await stop(worker, task)
    assert [res.output for res in results] == [f"r{i}" for i in range(200)]
    if kept:
        assert reads == 0  # every result came with the inbox
    else:
        assert reads >= 190  # nothing kept: each late waiter read its result


async def test_an_inbox_entry_with_only_an_id_still_resolves(
        redis_url: str, r: redis.Redis) -> None:
    async with inferq.AsyncClient(redis_url) as client:
        handle = await client.enqueue("no worker here", model="t")
        waiting = asyncio.ensure_future(handle.result(timeout=10))
        await asyncio.sleep(0)
        reply_to = r.hget(KEYS.request(handle.id), "rt")
        assert isinstance(reply_to, bytes)
        body = encode_result(Result(id=handle.id, status=Status.OK, output=[1.0]))
        r.rpush(KEYS.result(handle.id), body)
        r.rpush(KEYS.inbox(reply_to.decode()), handle.id)  # the old format
        result = await waiting
    assert result.output == [1.0]
