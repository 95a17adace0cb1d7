"""A non-text model served through inferq: a softmax linear classifier in pure numpy.

Each request's prompt is a JSON array of ``dim`` numbers (a feature vector); the output is
``{"label": int, "probs": [float, ...]}``. A batch is one matrix product, so batching pays.

    inferq worker --model clf=python:examples.linear_classifier:LinearClassifier?dim=4 \
        --task classify

    import inferq, json
    client = inferq.Client("redis://localhost:6379/0")
    handle = client.enqueue(json.dumps([5.1, 3.5, 1.4, 0.2]), model="clf", task="classify")
    print(handle.result(timeout=30).output)

Options (``?key=value``): ``dim`` (features, default 4), ``classes`` (default 3), ``seed``
(weights drawn from it, default 0) or ``weights`` (a ``.npz`` with ``W`` (dim x classes) and
``b`` (classes)). ``reference`` computes the same outputs without the queue (for tests).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferq.models import InvalidInput, Model, ModelInput, RequestPayload, options_of


class LinearClassifier(Model):
    tasks = frozenset({"classify"})

    def load(self) -> None:
        opts = options_of(self, {"dim": "4", "classes": "3", "seed": "0", "weights": ""})
        if opts["weights"]:
            with np.load(opts["weights"]) as saved:
                self.W = np.asarray(saved["W"], dtype=np.float32)
                self.b = np.asarray(saved["b"], dtype=np.float32)
        else:
            rng = np.random.default_rng(int(opts["seed"]))
            dim, classes = int(opts["dim"]), int(opts["classes"])
            self.W = rng.standard_normal((dim, classes)).astype(np.float32)
            self.b = rng.standard_normal(classes).astype(np.float32)
        self.dim = self.W.shape[0]

    def prepare_one(self, payload: RequestPayload) -> ModelInput:
        values = json.loads(payload.prompt)  # not JSON: ValueError -> invalid_input
        if (not isinstance(values, list) or len(values) != self.dim
                or not all(isinstance(v, int | float) for v in values)):
            raise InvalidInput(f"expected a JSON array of {self.dim} numbers")
        return ModelInput(1, np.asarray(values, dtype=np.float32))

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        x = np.stack([item.data for item in batch])        # (rows, dim): one product
        return reference(x, self.W, self.b)


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> list[dict[str, Any]]:
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return [{"label": int(p.argmax()), "probs": [float(v) for v in p]} for p in probs]
