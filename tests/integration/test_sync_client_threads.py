"""The synchronous ``Client`` waits like the async one: one listener thread per client (and
queue) on its reply inbox hands results to every waiting thread, so thousands of threads wait on
one ``Client`` over a small, bounded pool."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

import inferq
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import KEYS, config

THREADS = 2_000


@contextmanager
def worker_in_a_thread(url: str) -> Iterator[WindowWorker]:
    """A window worker on the echo model, run by its own event loop on a thread."""
    worker = WindowWorker(config(url, max_batch_size=64), EchoModel())
    ready = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        ready.set()
        await worker.run(install_signal_handlers=False)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield worker
    finally:
        loops[0].call_soon_threadsafe(worker.request_stop)
        thread.join(30)
        assert not thread.is_alive()


def test_two_thousand_threads_wait_on_one_client(redis_url: str, r: redis.Redis) -> None:
    client = inferq.Client(redis_url, options=inferq.ClientOptions(max_connections=8),
                           client_name="threads-test")
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    waiting = threading.Semaphore(0)

    def one(i: int) -> None:
        try:
            handle = client.enqueue(f"t{i}", model="t")
            waiting.release()
            results[i] = handle.result(timeout=120).output
        except BaseException as exc:
            errors.append(exc)
            waiting.release()

    previous = threading.stack_size(256 * 1024)
    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
    finally:
        threading.stack_size(previous)
    for _ in range(THREADS):  # every thread has enqueued and is about to wait
        assert waiting.acquire(timeout=120)
    with worker_in_a_thread(redis_url):
        for t in threads:
            t.join(120)
    assert errors == []
    assert results == {i: f"t{i}" for i in range(THREADS)}
    pool = client.redis.connection_pool
    assert isinstance(pool, redis.BlockingConnectionPool)
    assert len(pool._connections) <= 8  # the pool never grew past its bound
    named = [c for c in r.client_list() if c.get("name") == "threads-test"]
    assert 1 <= len(named) <= 8
    client.close()


def test_a_sync_wait_times_out_and_a_late_waiter_gets_a_result_popped_earlier(
        redis_url: str, r: redis.Redis) -> None:
    with inferq.Client(redis_url) as client:
        first = client.enqueue("no worker yet", model="t")
        with pytest.raises(inferq.ResultTimeout):
            first.result(timeout=0.2)
        handles = client.enqueue_many([f"r{i}" for i in range(50)], model="t")
        with worker_in_a_thread(redis_url):
            assert first.result(timeout=30).output == "no worker yet"
            # Wait for the others one by one: most were popped by the listener before their
            # waiter came, and are handed over from what it kept.
            assert [h.result(timeout=30).output for h in handles] == \
                [f"r{i}" for i in range(50)]
        # A handle built from a bare id (another process) blocks on the result key instead.
        assert client.handle(handles[3].id, model="t").result(timeout=5).output == "r3"
        assert r.llen(KEYS.inbox(client.client_id)) == 0  # everything was taken off the inbox


def test_a_closed_client_still_waits(redis_url: str) -> None:
    client = inferq.Client(redis_url)
    with pytest.raises(inferq.ResultTimeout):
        client.enqueue("first", model="t").result(timeout=0.1)  # starts a listener
    handle = client.enqueue("after close", model="t")
    client.close()
    with worker_in_a_thread(redis_url):
        assert handle.result(timeout=30).output == "after close"
    client.close()
