"""A real ``inferq worker`` process on MiniLM, driven through the producer SDK."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch
from transformers import AutoModel, AutoTokenizer

import inferq
from inferq.embedded import EmbeddedServer
from inferq.worker.models.embedding import mean_pool
from inferq.worker.models.registry import minilm_path
from tests.support.processes import WorkerProcess

WORDS = [
    "queue", "worker", "batch", "window", "redis", "token", "priority", "lease", "result",
    "model", "embedding", "request", "durable", "crash", "restart", "sentence", "vector",
    "cluster", "latency", "throughput",
]


def sentences(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def minilm_worker(server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[str, WorkerProcess]]:
    """One MiniLM worker for the module (the model loads once)."""
    client = redis.Redis.from_url(server.url)
    client.flushall()
    worker = WorkerProcess(server.url, "--model", "minilm", "--device", "cpu",
                           "--max-batch-size", "32", "--max-wait-ms", "20",
                           log_dir=tmp_path_factory.mktemp("logs"))
    # Readiness: the first request is answered once the model has loaded.
    producer = inferq.Client(server.url)
    producer.enqueue("warm up", model="minilm").result(timeout=120)
    producer.close()
    yield server.url, worker
    assert worker.stop() == 0, worker.log
    client.close()


def direct_embedding(texts: list[str]) -> list[list[float]]:
    """The model called directly on one input at a time: the reference."""
    path = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tokenizer(text, return_tensors="pt", truncation=True, max_length=256)
            hidden = model(**enc).last_hidden_state
            out.append(mean_pool(hidden, enc["attention_mask"])[0].tolist())
    return out


async def test_200_concurrent_mixed_priority_requests_match_the_direct_model(
        minilm_worker: tuple[str, WorkerProcess]) -> None:
    url, _ = minilm_worker
    texts = sentences(200)
    priorities = [(0, 3, 9)[i % 3] for i in range(200)]
    async with inferq.AsyncClient(url) as client:
        handles = await asyncio.gather(*(
            client.enqueue(text, model="minilm", priority=prio)
            for text, prio in zip(texts, priorities, strict=True)
        ))
        results = await asyncio.gather(*(h.result(timeout=120) for h in handles))
    assert len(results) == 200 and all(r.ok for r in results)
    assert {r.id for r in results} == {h.id for h in handles}
    reference = direct_embedding(texts)
    worst = max(abs(a - b) for r, ref in zip(results, reference, strict=True)
                for a, b in zip(r.output, ref, strict=True))
    assert worst < 1e-5, f"max abs difference {worst}"
    assert all(len(r.output) == 384 for r in results)
    assert max(r.batch_size or 0 for r in results) > 1
    assert all(r.compute_ms is not None and r.compute_ms > 0 for r in results)


def test_a_backlog_is_served_highest_priority_first(
        minilm_worker: tuple[str, WorkerProcess]) -> None:
    url, _ = minilm_worker
    client = inferq.Client(url)
    texts = sentences(64, seed=11)
    priorities = [9] * 16 + [5] * 16 + [0] * 32
    random.Random(3).shuffle(priorities)
    # One atomic enqueue: the whole backlog is in Redis before the worker's next claim.
    handles = client.enqueue_many(
        [{"prompt": t, "priority": p} for t, p in zip(texts, priorities, strict=True)],
        model="minilm")
    results = [h.result(timeout=120) for h in handles]
    finished = {p: [r.finished_ms or 0 for r, q in zip(results, priorities, strict=True)
                    if q == p] for p in (9, 5, 0)}
    assert max(finished[9]) < min(finished[0])
    assert max(finished[5]) < min(finished[0])
    client.close()


def test_stats_show_the_queue_and_the_live_worker(
        minilm_worker: tuple[str, WorkerProcess]) -> None:
    from inferq.cli.main import main

    url, _ = minilm_worker
    client = redis.Redis.from_url(url)
    from inferq.stats import read_all

    (stats,) = read_all(client, ["embed:minilm"])
    assert len(stats.live_workers) == 1
    assert stats.counters.get("ok", 0) >= 1
    assert main(["stats", "--redis-url", url]) == 0
    client.close()


def test_a_bad_model_path_fails_with_a_clear_error(tmp_path: Path, redis_url: str) -> None:
    worker = WorkerProcess(redis_url, "--model", f"x={tmp_path / 'missing'}",
                           log_dir=tmp_path)
    assert worker.proc.wait(timeout=120) == 2
    worker.stop()
    # Checked before the model loads, in one line that says what is wrong with the path.
    assert worker.log.splitlines()[-1] == (
        f"inferq: error [invalid_config]: --model x={tmp_path / 'missing'}: no such folder")
    assert "Traceback" not in worker.log and "loading model" not in worker.log


def test_a_long_input_is_truncated_and_says_so_or_refused_on_request(
        minilm_worker: tuple[str, WorkerProcess]) -> None:
    url, _ = minilm_worker
    long_text = " ".join(WORDS * 40)  # ~800 words, far over MiniLM's 256 tokens
    with inferq.Client(url) as client:
        cut = client.enqueue(long_text, model="minilm").result(timeout=120)
        assert cut.ok and cut.truncated is True and cut.input_tokens == 256
        # The same embedding as the model given the first 256 tokens (what truncation keeps).
        (reference,) = direct_embedding([long_text])
        assert max(abs(a - b) for a, b in zip(cut.output, reference, strict=True)) < 1e-4
        short = client.enqueue("a short sentence", model="minilm").result(timeout=120)
        assert short.ok and short.truncated is None
        with pytest.raises(inferq.RequestFailed) as refused:
            client.enqueue(long_text, model="minilm",
                           params={"truncate": False}).result(timeout=120)
        assert refused.value.error_code == "invalid_input"
        assert "longer than the model's maximum of 256 tokens" in refused.value.message
        fits = client.enqueue("fits", model="minilm", params={"truncate": False})
        assert fits.result(timeout=120).ok
