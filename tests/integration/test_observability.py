"""A worker's Prometheus metrics and health endpoint, and ``inferq stats --watch``, in-process
against a real server."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

import inferq
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.metrics import health, scrape
from tests.support.processes import wait_until
from tests.support.window_worker import config, run_worker, stop


async def server_ms(client: inferq.AsyncClient) -> int:
    seconds, micros = await client.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_worker_exports_prometheus_metrics_and_health(redis_url: str) -> None:
    worker = WindowWorker(config(redis_url, metrics_port=0, lease_ms=1_000), EchoModel())
    async with inferq.AsyncClient(redis_url) as client:
        # Expired before any worker can claim it: the server's clock passes its deadline first.
        expired = await client.enqueue("never", model="t", deadline_s=0.001)
        start_ms = await server_ms(client)
        while await server_ms(client) < start_ms + 2:
            await asyncio.sleep(0)
        task = await run_worker(worker)
        with pytest.raises(inferq.DeadlineExceeded):
            await expired.result(timeout=10)
        handles = await client.enqueue_many(
            [{"prompt": f"r{i}", "priority": 5 if i % 2 else 0} for i in range(20)], model="t")
        await asyncio.gather(*(h.result(timeout=10) for h in handles))
    assert worker.metrics_server is not None
    port = worker.metrics_server.server_address[1]
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []

    def healthy() -> bool:
        status, detail = health(port)
        seen.append(detail)
        return status == 200

    await loop.run_in_executor(None, lambda: wait_until(healthy, 30, "healthz to report ok"))
    assert seen[-1]["status"] == "ok" and seen[-1]["worker"] == "test-worker"
    samples = await loop.run_in_executor(None, scrape, port)
    q = "queue=embed:t"
    assert samples[f"inferq_requests_total{{{q},status=ok}}"] == 20
    assert sum(v for k, v in samples.items()
               if k.startswith("inferq_batch_releases_total{")) == worker.stats.batches
    assert samples[f"inferq_batch_size_count{{{q}}}"] == worker.stats.batches
    assert samples[f"inferq_queue_wait_seconds_count{{priority=5,{q}}}"] == 10
    assert samples[f"inferq_claim_to_result_seconds_count{{priority=0,{q}}}"] == 10
    assert samples[f"inferq_tokens_total{{{q}}}"] > 0
    assert samples[f"inferq_expired_total{{{q}}}"] == 1
    assert samples[f"inferq_requests_total{{{q},status=expired}}"] == 1
    assert samples[f"inferq_live_workers{{{q}}}"] == 1
    assert samples[f"inferq_worker_info{{{q},worker=test-worker}}"] == 1
    await stop(worker, task)


def test_stats_watch_refreshes(redis_url: str, r: redis.Redis,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.cli.stats import watch

    r.sadd("inferq:queues", "embed:t")
    inferq.Client(redis_url).enqueue("x", model="t", priority=3)
    assert watch(r, None, 0.01, as_json=True, rounds=2) == 0
    frames = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(frames) == 2
    assert frames[0]["queues"][0]["pending_by_priority"] == {"3": 1}
