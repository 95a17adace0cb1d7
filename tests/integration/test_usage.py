"""Billable usage, counted by the complete script where each final result is written: once
per request through repeated writes, zombie workers, retries and crashes; read back summed
over shards by ``inferq.usage`` (and ``inferq usage``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI

import inferq
from inferq import plans
from inferq.cli.main import main
from inferq.gateway import errors
from inferq.gateway.admin import OpsState
from inferq.gateway.authn import Authenticator
from inferq.gateway.usage_routes import admin_usage, usage_metrics
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, Usage, encode_result
from inferq.protocol.keys import USAGE_RETENTION_MS, QueueKeys, TenancyKeys
from inferq.tenancy import KeyStore
from inferq.usage import bounded, parse_since, prometheus_text, report
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import config, run_worker, stop

GEN = QueueKeys.for_model("generate", "m")
TTL_MS = 60_000

pytestmark = pytest.mark.filterwarnings("ignore::inferq.producer.presence.NoWorkerWarning")


class Worker:
    def __init__(self, r: redis.Redis, keys: QueueKeys = GEN) -> None:
        self.r, self.keys, self.s = r, keys, ops.register(r)

    def claim(self, owner: str = "w", n: int = 10) -> list[ops.Claimed]:
        k, a = ops.claim_call(self.keys, owner, 30_000, n, TTL_MS)
        return ops.parse_claim(self.s["claim"](keys=k, args=a)).claimed

    def complete(self, claimed: list[ops.Claimed], prompt: int = 5, completion: int = 7,
                 status: str = "ok") -> list[bool]:
        items = [ops.Completion(c, status, b"" if status == "retry" else encode_result(Result(
            id=c.id, status=Status(status), output="x", attempts=c.attempt,
            usage=Usage(prompt_tokens=prompt, completion_tokens=completion))),
            retry_delay_ms=0, prompt_tokens=prompt, completion_tokens=completion)
            for c in claimed]
        k, a = ops.complete_call(self.keys, TTL_MS, 100, items)
        return ops.parse_complete(self.s["complete"](keys=k, args=a))

    def reclaim(self) -> None:
        for member in self.r.zrange(self.keys.inflight, 0, -1):
            self.r.zadd(self.keys.inflight, {member: 0})  # every lease as if long expired
        k, a = ops.reclaim_call(self.keys, 100, TTL_MS, 100)
        self.s["reclaim"](keys=k, args=a)


def usage(r: redis.Redis, **options: Any) -> dict[tuple[str, str], tuple[int, int, int]]:
    got = plans.run(r, report(**options))
    return {(row.tenant, row.queue): (row.requests, row.prompt_tokens, row.completion_tokens)
            for row in got.rows}


def test_a_request_completed_twice_counts_once(client: inferq.Client, r: redis.Redis) -> None:
    client.enqueue("a", task="generate", model="m", tenant="acme")
    client.enqueue("b", task="generate", model="m")
    w = Worker(r)
    claimed = w.claim()
    assert w.complete(claimed) == [True, True]
    assert w.complete(claimed) == [False, False]  # the same write again: refused, not counted
    expected = {("acme", "generate:m"): (1, 5, 7)}  # "b" has no tenant: not counted
    hourly = [k for k in r.keys(GEN.prefix + "usage:*") if k != GEN.usage_total.encode()]
    assert len(hourly) == 1 and r.pttl(hourly[0]) > USAGE_RETENTION_MS
    assert r.pttl(GEN.usage_total) == -1
    assert usage(r) == expected
    assert usage(r, all_time=True) == expected
    assert usage(r, tenant="acme") == {("acme", "generate:m"): (1, 5, 7)}


def test_a_zombie_and_a_retry_count_nothing_and_the_final_run_counts_once(
        client: inferq.Client, r: redis.Redis) -> None:
    client.enqueue("a", task="generate", model="m", tenant="acme", max_attempts=5)
    w = Worker(r)
    first = w.claim("w1")
    assert w.complete(first, status="retry") == [True]  # a failed run sent back: no usage
    assert usage(r) == {}
    second = w.claim("w2")
    w.reclaim()  # w2 "crashed": its lease expired and the request went back to pending
    third = w.claim("w3")
    assert w.complete(second, 100, 100) == [False]  # the zombie's late write: refused
    assert w.complete(third, 3, 4) == [True]
    assert w.complete(third, 3, 4) == [False]
    assert usage(r) == {("acme", "generate:m"): (1, 3, 4)}


def test_usage_sums_the_shards_of_a_queue(client: inferq.Client, r: redis.Redis) -> None:
    r.hset(GEN.config, "shards", 3)
    ids = [f"x{i}" for i in range(12)]
    for request_id in ids:
        client.enqueue("p", task="generate", model="m", tenant="acme", id=request_id)
    on = {GEN.for_shard(k) for k in range(3) if r.zcard(GEN.for_shard(k).pending)}
    assert len(on) > 1
    for shard in on:
        w = Worker(r, shard)
        w.complete(w.claim(n=100), 2, 1)
    assert usage(r) == {("acme", "generate:m"): (12, 24, 12)}


def test_since_durations_and_dates() -> None:
    now = 1_700_000_000_000
    assert parse_since("24h", now) == now - 24 * 3_600_000
    assert parse_since("90s", now) == now - 90_000
    assert parse_since("2023-11-14", now) == 1_699_920_000_000
    assert parse_since("2023-11-14T22:13:20Z", now) == now
    with pytest.raises(inferq.ValidationError):
        parse_since("yesterday", now)


def test_since_in_the_future_counts_nothing(client: inferq.Client, r: redis.Redis) -> None:
    client.enqueue("a", task="generate", model="m", tenant="acme")
    w = Worker(r)
    w.complete(w.claim())
    assert usage(r, since_ms=4_000_000_000_000) == {}


def test_prometheus_labels_are_bounded(client: inferq.Client, r: redis.Redis) -> None:
    for name in ("t1", "t2", "t3"):
        client.enqueue("a", task="generate", model="m", tenant=name)
    w = Worker(r)
    w.complete(w.claim())
    rows = plans.run(r, report(all_time=True)).rows
    kept = bounded(rows, tenants=["t1"])
    assert {row.tenant for row in kept} == {"t1", "other"}
    text = prometheus_text(kept)
    assert ('inferq_tenant_tokens_total{tenant="other",task="generate",model="m",'
            'kind="prompt"} 10') in text
    assert 'inferq_tenant_requests_total{tenant="t1",task="generate",model="m"} 1' in text
    assert {row.tenant for row in bounded(rows, top=2)} == {"t1", "t2", "other"}


def test_the_cli(client: inferq.Client, r: redis.Redis, redis_url: str,
                 capsys: pytest.CaptureFixture[str]) -> None:
    client.enqueue("a", task="generate", model="m", tenant="acme")
    w = Worker(r)
    w.complete(w.claim(), 11, 22)
    assert main(["usage", "--redis-url", redis_url, "--json", "--since", "1h"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["usage"] == [{"tenant": "acme", "task": "generate", "model": "m",
                             "requests": 1, "prompt_tokens": 11, "completion_tokens": 22,
                             "total_tokens": 33}]
    assert main(["usage", "--redis-url", redis_url, "--tenant", "nobody"]) == 0
    assert "no usage" in capsys.readouterr().out
    assert main(["usage", "--redis-url", redis_url]) == 0
    text = capsys.readouterr().out
    assert "acme" in text and "generate:m" in text and "33" in text


async def test_a_real_worker_counts_each_results_input_tokens(
        redis_url: str, aclient: inferq.AsyncClient, r: redis.Redis) -> None:
    prompts = ["one", "two words", "and three words here"]
    handles = await aclient.enqueue_many(prompts, model="t", tenant="acme")
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    results = [await h.result(timeout=30) for h in handles]
    await stop(worker, task)
    tokens = [res.input_tokens or 0 for res in results]
    assert all(tokens)
    assert usage(r) == {("acme", "embed:t"): (3, sum(tokens), 0)}


async def test_the_admin_route_and_the_metrics_route(aclient: inferq.AsyncClient,
                                                     r: redis.Redis) -> None:
    for name in ("t1", "t2"):
        await aclient.enqueue("a", task="generate", model="m", tenant=name)
    w = Worker(r)
    w.complete(w.claim(), 2, 3)
    KeyStore(r).create("t1")
    app = FastAPI()
    app.state.ops = OpsState(client=aclient, auth=Authenticator(
        aclient.redis, TenancyKeys(), token=None))
    errors.install(app, 1)
    app.include_router(admin_usage)
    app.include_router(usage_metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        got = (await http.get("/admin/usage", params={"tenant": "t2", "since": "2h"})).json()
        assert [(u["tenant"], u["total_tokens"]) for u in got["usage"]] == [("t2", 5)]
        every = (await http.get("/admin/usage", params={"since": "all"})).json()
        assert every["since"] is None and len(every["usage"]) == 2
        bad = await http.get("/admin/usage", params={"since": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        text = (await http.get("/metrics/usage")).text
    # t1 has a key, t2 has none: its usage is "other"
    assert 'inferq_tenant_requests_total{tenant="t1",task="generate",model="m"} 1' in text
    assert ('inferq_tenant_tokens_total{tenant="other",task="generate",model="m",'
            'kind="completion"} 3') in text
    assert 't2' not in text
