"""Metrics, health, structured logs, and the bulk/watch CLI paths."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import inferq
from inferq.logs import JsonFormatter, set_context
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import Worker
from tests.conftest import WorkerProcess, wait_until
from tests.integration.test_worker import config, run_worker, stop
from tests.metrics_client import health, scrape


async def server_ms(client: inferq.AsyncClient) -> int:
    seconds, micros = await client.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_worker_exports_prometheus_metrics_and_health(redis_url: str) -> None:
    worker = Worker(config(redis_url, metrics_port=0, lease_ms=1_000), EchoModel())
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


def test_dashboard_and_alerting_use_metrics_the_worker_exports() -> None:
    import re

    from inferq.worker.core.metrics import WorkerMetrics

    exported = WorkerMetrics("embed:t", "w").names()
    dashboard = Path("deploy/grafana/dashboards/inferq.json").read_text()
    used = set(re.findall(r"\binferq_[a-z_]+", dashboard))
    assert used, "the dashboard queries no inferq metric"
    unknown = used - exported
    assert not unknown, f"dashboard uses metrics the worker does not export: {unknown}"
    # Every panel's unit-bearing family is covered: depth, latency, batches, errors.
    for required in ("inferq_queue_depth", "inferq_claim_to_result_seconds_bucket",
                     "inferq_batch_size_bucket", "inferq_batch_releases_total",
                     "inferq_window_seconds", "inferq_dead_letters_total"):
        assert required in used, f"the dashboard has no panel for {required}"


def test_json_logs_carry_context_and_extras() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("inferq.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    set_context(worker="w-1", queue="embed:t")
    logger.warning("batch %d done", 7, extra={"batch_id": 7, "request_ids": ["a", "b"]})
    entry = json.loads(stream.getvalue())
    assert entry["msg"] == "batch 7 done" and entry["level"] == "warning"
    assert entry["worker"] == "w-1" and entry["queue"] == "embed:t"
    assert entry["batch_id"] == 7 and entry["request_ids"] == ["a", "b"]


def test_worker_logs_are_json_lines_when_not_on_a_terminal(
        redis_url: str, start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--model", "echo", "--worker-id", "json-worker")
    client = inferq.Client(redis_url)
    assert client.enqueue("hi", model="echo").result(timeout=60).output == "hi"
    client.close()
    assert worker.stop() == 0
    lines = [json.loads(line) for line in worker.log.splitlines() if line.startswith("{")]
    assert lines, worker.log
    assert all(entry["worker"] == "json-worker" for entry in lines)
    assert any("serving embed:echo" in entry["msg"] for entry in lines)


def test_enqueue_file_writes_one_result_per_line(
        redis_url: str, tmp_path: Path, start_worker: Callable[..., WorkerProcess]) -> None:
    import subprocess

    start_worker("--model", "echo")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([json.dumps("plain"), json.dumps({"prompt": "x", "id": "x1",
                                                                   "priority": 9}),
                                  "", json.dumps({"prompt": "late", "deadline_s": 0.001})]))
    out = tmp_path / "results.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "inferq", "enqueue", "--file", str(prompts), "--out", str(out),
         "--model", "echo", "--redis-url", redis_url, "--timeout", "60"],
        capture_output=True, text=True, timeout=120, check=False)
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in results][:2] == ["ok", "ok"]
    assert results[1]["id"] == "x1" and results[0]["output"] == "plain"
    assert len(results) == 3
    assert "3 requests in" in done.stderr
    assert done.returncode == (0 if results[2]["status"] == "ok" else 1)


def test_stats_watch_refreshes(redis_url: str, r: redis.Redis,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.cli.stats_cmd import watch

    r.sadd("inferq:queues", "embed:t")
    inferq.Client(redis_url).enqueue("x", model="t", priority=3)
    assert watch(r, None, 0.01, as_json=True, rounds=2) == 0
    frames = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(frames) == 2
    assert frames[0]["queues"][0]["pending_by_priority"] == {"3": 1}
