"""Fair shares through real window workers over a sharded queue: three tenants with weights
3:2:1 flood three shards served by two workers; the order the models ran them in gives each
its share of the cost, the workers' metrics and ``inferq stats`` count per tenant."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import redis

import inferq
from inferq import stats
from inferq.protocol.settings import (
    SET_SETTINGS,
    SET_TENANTS,
    settings_call,
    tenants_call,
)
from inferq.worker.models.builtin import SleepModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import KEYS, config, run_worker, stop

WEIGHTS = {"a": 3, "b": 2, "c": 1}
PER_TENANT = 120


def configure(r: redis.Redis) -> None:
    keys, args = settings_call(KEYS.config, 3, "keep")
    r.register_script(SET_SETTINGS)(keys=keys, args=args)
    keys, args = tenants_call(KEYS.config, weights=WEIGHTS)
    r.register_script(SET_TENANTS)(keys=keys, args=args)


async def test_three_shards_serve_weighted_cost_shares(redis_url: str, r: redis.Redis,
                                                       tmp_path: Path) -> None:
    configure(r)
    async with inferq.AsyncClient(redis_url, options=inferq.ClientOptions(
            warn_no_worker=False)) as client:
        handles = await client.enqueue_many(
            [{"prompt": f"{t}-{i:04d}-" + "x" * 33, "tenant": t}  # 40 bytes: cost 10
             for i in range(PER_TENANT) for t in WEIGHTS], model="t")
        waiting = stats.read_queue(r, KEYS)
        assert waiting.tenants == {t: PER_TENANT for t in WEIGHTS}  # summed over 3 shards
        assert waiting.shards == 3
        model = SleepModel(batch_ms=2, record=str(tmp_path))  # one file: the order they ran in
        workers = [WindowWorker(config(redis_url, max_batch_size=6, worker_id=f"w{k}"), model)
                   for k in range(2)]
        tasks = [await run_worker(w) for w in workers]
        try:
            await asyncio.gather(*(h.result(timeout=60) for h in handles))
        finally:
            for worker, task in zip(workers, tasks, strict=True):
                await stop(worker, task)
    (ran_file,) = tmp_path.glob("*.ran")
    ran = [line.split("-")[0] for line in ran_file.read_text().splitlines()]
    assert len(ran) == 3 * PER_TENANT
    # While all three wait (the first half of the work), cost shares follow the weights.
    first = Counter(ran[: 3 * PER_TENANT // 2])
    total = sum(first.values())
    for tenant, weight in WEIGHTS.items():
        assert abs(first[tenant] / total - weight / 6) <= 0.05, (tenant, first)
    samples: Counter[tuple[str, str | None]] = Counter()
    for worker in workers:
        for metric in worker.metrics.registry.collect():
            for s in metric.samples:
                samples[(s.name, s.labels.get("tenant"))] += s.value
    for tenant in WEIGHTS:  # named in the queue's settings: a label of its own
        assert samples[("inferq_tenant_cost_total", tenant)] == 10 * PER_TENANT
        assert samples[("inferq_tenant_queue_wait_seconds_count", tenant)] == PER_TENANT
    assert stats.read_queue(r, KEYS).tenants == {}  # all finished
