"""``results(handles)``: every result in order, failures as results (not raised), a second
call and concurrent waiters served alike, a timeout that leaves the client usable, handles
made from ids mixed with enqueued ones; the async client waits with one future for all."""

from __future__ import annotations

import asyncio

import pytest
import redis

import inferq
from inferq.errors import ResultTimeout
from inferq.protocol.codec import Status
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import config, run_worker, stop

pytestmark = pytest.mark.filterwarnings("ignore::inferq.producer.presence.NoWorkerWarning")


async def test_results_in_order_with_failures_twice_and_concurrently(
        redis_url: str, r: redis.Redis) -> None:
    async with inferq.AsyncClient(redis_url) as client:
        handles = await client.enqueue_many([f"r{i}" for i in range(300)], model="t")
        assert (await handles[7].cancel()).value == "cancelled"  # no worker yet
        with pytest.raises(ResultTimeout, match="299 of 300 results missing"):
            await client.results(handles, timeout=0.2)
        worker = WindowWorker(config(redis_url), EchoModel())
        task = await run_worker(worker)
        try:
            alone = asyncio.ensure_future(handles[3].result(timeout=30))
            first, second = await asyncio.gather(client.results(handles, timeout=30),
                                                 client.results(handles[::-1], timeout=30))
            again = await client.results(handles, timeout=30)  # all delivered already
            by_id = await client.results([client.handle(h.id, model="t") for h in handles[:5]])
            assert (await alone).output == "r3"
        finally:
            await stop(worker, task)
    expected = [f"r{i}" for i in range(300)]
    for got in (first, second[::-1], again):
        assert [x.output for x in got if x.ok] == expected[:7] + expected[8:]
        assert got[7].status is Status.CANCELLED and not got[7].ok
        assert [x.id for x in got] == [h.id for h in handles]
    assert [x.output for x in by_id] == expected[:5]
    assert await asyncio.wait_for(asyncio.sleep(0, "usable"), 1) == "usable"


async def test_results_of_nothing_and_a_bad_timeout() -> None:
    async with inferq.AsyncClient("redis://127.0.0.1:1/0") as client:
        assert await client.results([]) == []
        with pytest.raises(inferq.ValidationError):
            await client.results([], timeout=-1)


async def test_the_sync_client_gives_the_same(redis_url: str) -> None:
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    try:
        def run() -> tuple[list[inferq.Result], list[inferq.Result]]:
            with inferq.Client(redis_url) as client:
                handles = client.enqueue_many([f"s{i}" for i in range(50)], model="t")
                return client.results(handles, timeout=30), client.results(handles, timeout=30)
        first, again = await asyncio.to_thread(run)
    finally:
        await stop(worker, task)
    assert [x.output for x in first] == [x.output for x in again] == [f"s{i}" for i in range(50)]


def test_the_sync_client_times_out_with_handles_of_both_kinds(redis_url: str) -> None:
    """No worker: the inbox handles and a handle made from an id each get their last look
    once the shared deadline has passed, and the whole call is a ResultTimeout."""
    with inferq.Client(redis_url) as client:
        handles = client.enqueue_many(["a", "b"], model="t")
        mixed = [*handles, client.handle(handles[0].id, model="t")]
        with pytest.raises(ResultTimeout, match="3 of 3 results missing"):
            client.results(mixed, timeout=0.2)
        handles[1].cancel()
        with pytest.raises(ResultTimeout, match="2 of 3 results missing"):
            client.results(mixed, timeout=0.2)
