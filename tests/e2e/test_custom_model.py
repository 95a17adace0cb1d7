"""Your own model through the queue: a real ``inferq worker`` process serving the example
``python:examples.linear_classifier:LinearClassifier``, results checked against numpy."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import inferq
from examples.linear_classifier import LinearClassifier, reference
from tests.support.processes import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
SPEC = "clf=python:examples.linear_classifier:LinearClassifier?dim=4&seed=3"


def test_the_example_model_serves_batches_and_a_bad_input_fails_alone(
        start_worker: Callable[..., WorkerProcess], client: inferq.Client) -> None:
    rows = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    prompts = [json.dumps([float(v) for v in row]) for row in rows]
    prompts.insert(5, "[1, 2]")  # wrong length
    handles = client.enqueue_many(prompts, model="clf", task="classify")
    worker = start_worker("--model", SPEC, "--task", "classify", "--max-wait-ms", "5",
                          env={"PYTHONPATH": str(ROOT)})
    bad = handles.pop(5)
    results = [h.result(timeout=60) for h in handles]
    with pytest.raises(inferq.RequestFailed) as info:
        bad.result(timeout=60)
    assert info.value.error_code == "invalid_input", worker.log
    model = LinearClassifier(dim="4", seed="3")
    model.load()
    expected = reference(rows, model.W, model.b)
    for got, want in zip(results, expected, strict=True):
        assert got.output["label"] == want["label"]
        assert np.allclose(got.output["probs"], want["probs"], atol=1e-6)
    assert max(r.batch_size or 0 for r in results) > 1  # a batch is one matrix product
    assert worker.stop() == 0
