"""``score`` and request-level ``generate`` in the window worker (``window.worker``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

import inferq
from inferq.connection import ConnectionSettings
from inferq.worker.core.config import WorkerConfig
from inferq.worker.models.batch_models import RequestLevelGenerator, ScoringModel
from inferq.worker.models.lm import CausalLM
from inferq.worker.window.worker import WindowWorker
from tests.support.generation import MODEL, greedy_reference


def window_config(url: str, task: str, **kw: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(connection=ConnectionSettings(url), model_name=MODEL,
                                model_spec="tiny", task=task,
                                max_batch_size=8, max_wait_ms=20, lease_ms=5_000,
                                worker_id=f"{task}-worker")
    base.update(kw)
    return WorkerConfig(**base)


async def serve(worker: WindowWorker, coro: Any) -> Any:
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        return await coro
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=30)


async def test_score_gives_per_token_logprobs_batched_like_alone(
        redis_url: str, aclient: inferq.AsyncClient, lm: CausalLM) -> None:
    texts = ["the capital of France is Paris", "a queue", "what is the worker doing today"]
    worker = WindowWorker(window_config(redis_url, "score"), ScoringModel(lm))

    async def run() -> list[inferq.Result]:
        handles = await aclient.enqueue_many(texts, model=MODEL, task="score")
        return [await h.result(timeout=30) for h in handles]

    results = await serve(worker, run())
    assert max(r.batch_size or 0 for r in results) > 1  # scored as one padded batch
    for text, result in zip(texts, results, strict=True):
        ids = lm.tokenizer(text)["input_ids"]
        with torch.inference_mode():
            logits = lm.model(torch.tensor([ids])).logits[0].float()
        expected = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])
        out = result.output
        assert out["token_ids"] == ids and len(out["tokens"]) == len(ids)
        assert out["logprobs"][0] is None
        assert out["logprobs"][1:] == pytest.approx(expected[:, 0].tolist(), abs=1e-4)
        assert out["sum_logprob"] == pytest.approx(float(expected.sum()), abs=1e-3)
        assert all(lp <= 0 for lp in out["logprobs"][1:])
        assert math.isclose(out["mean_logprob"], out["sum_logprob"] / (len(ids) - 1))


async def test_score_refuses_params_and_messages(aclient: inferq.AsyncClient) -> None:
    with pytest.raises(inferq.ValidationError, match="params"):
        await aclient.enqueue("x", model=MODEL, task="score", params={"temperature": 1})
    with pytest.raises(inferq.ValidationError, match="messages"):
        await aclient.enqueue(messages=[{"role": "user", "content": "x"}], model=MODEL,
                              task="score")


async def test_request_level_generate_matches_greedy_and_reports_lengths(
        redis_url: str, aclient: inferq.AsyncClient, lm: CausalLM) -> None:
    specs = [("the queue", 5), ("what is the capital of France and the worker", 17),
             ("a", 9)]
    worker = WindowWorker(window_config(redis_url, "generate"), RequestLevelGenerator(lm))

    async def run() -> list[inferq.Result]:
        handles = await aclient.enqueue_many(
            [{"prompt": p, "params": {"max_new_tokens": n}} for p, n in specs],
            model=MODEL, task="generate")
        return [await h.result(timeout=30) for h in handles]

    results = await serve(worker, run())
    for (prompt, n), result in zip(specs, results, strict=True):
        expected = greedy_reference(lm, lm.tokenizer(prompt)["input_ids"], n)
        assert result.output["token_ids"] == expected
        assert result.output["completion_tokens"] == len(expected)
        assert result.output["finish_reason"] in ("stop", "length")
