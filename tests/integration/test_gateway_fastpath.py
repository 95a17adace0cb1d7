"""``/v1/embeddings`` through the gateway's fast path (``inferq.gateway.fastpath``) answers as
the FastAPI route does, and hands every call it does not serve to FastAPI unchanged."""

from __future__ import annotations

import asyncio
import base64
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from inferq.gateway.fastpath import EmbeddingsFastPath
from inferq.models import Model, ModelInput
from inferq.worker.window.worker import WindowWorker
from tests.support.gateway import MakeApi
from tests.support.window_worker import config


class Vectors(Model):
    """'abc' -> [3.0, 0.5, -1.0]: a tiny embedding model."""

    tasks = frozenset({"embed"})

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        return [[float(len(item.data)), 0.5, -1.0] for item in batch]


@pytest.fixture
def worker(redis_url: str) -> Iterator[None]:
    """An in-process window worker on ``embed:t`` (its own thread and loop)."""
    w = WindowWorker(config(redis_url), Vectors())
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(w.run(install_signal_handlers=False)),
        daemon=True)
    thread.start()
    yield
    loop.call_soon_threadsafe(w.request_stop)
    thread.join(timeout=30)


def fast_path_of(api: TestClient) -> EmbeddingsFastPath:
    app: Any = api.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(app, EmbeddingsFastPath):
        app = app.app
    return app


def calls(make_api: MakeApi, fast: bool, **settings: Any) -> AbstractContextManager[TestClient]:
    return make_api(fast_path=fast, **settings)


CASES: list[tuple[dict[str, Any], dict[str, str]]] = [
    ({"input": "abc", "model": "t"}, {}),
    ({"input": ["a", "abcd"], "model": "t", "priority": 3}, {}),
    ({"input": "ab", "model": "t", "encoding_format": "base64"}, {}),
    ({"input": "ab", "model": "t"}, {"X-Priority": "7"}),             # header: FastAPI serves
    ({"input": "ab", "model": "t", "temperature": 1}, {}),           # 422 from FastAPI
    ({"input": ["x"] * 3, "model": "t"}, {}),                        # 422 from the shared code
]


def test_same_answers_with_and_without_the_fast_path(make_api: MakeApi, worker: None) -> None:
    answers = {}
    for fast in (True, False):
        with calls(make_api, fast, max_embedding_inputs=2) as api:
            answers[fast] = [(r.status_code, r.json(), r.headers.get("X-Inferq-Usage"))
                             for r in (api.post("/v1/embeddings", json=body, headers=headers)
                                       for body, headers in CASES)]
            if fast:
                path = fast_path_of(api)
                assert (path.served, path.passed) == (4, 2)
    assert answers[True] == answers[False]
    status, body, usage = answers[True][0]
    assert status == 200 and usage == "estimated"
    assert body["data"] == [{"object": "embedding", "index": 0, "embedding": [3.0, 0.5, -1.0]}]
    b64 = answers[True][2][1]["data"][0]["embedding"]
    assert struct.unpack("<3f", base64.b64decode(b64)) == (2.0, 0.5, -1.0)
    assert answers[True][4][0] == 422 and answers[True][4][1]["error"]["param"] == "temperature"
    assert answers[True][5][0] == 422 and answers[True][5][1]["error"]["param"] == "input"


def test_a_wrong_token_goes_to_fastapi_and_is_refused(make_api: MakeApi) -> None:
    from pydantic import SecretStr

    with make_api(token=SecretStr("right")) as api:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = api.post("/v1/embeddings", json={"input": "a", "model": "t"},
                                headers=headers)
            assert response.status_code == 401
        assert fast_path_of(api).served == 0
