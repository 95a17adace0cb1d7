"""``/v1/embeddings`` paths that need no worker: validation, back-pressure, timeouts, and a
worker-side failure (the test writes it)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from tests.support.gateway import ECHO, MakeApi


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"input": "x", "model": "no spaces allowed"}, {}, "model"),
    ({"input": [1, 2, 3], "model": "echo"}, {}, "input"),
    ({"input": 5, "model": "echo"}, {}, "input"),
    ({"input": [], "model": "echo"}, {}, "input"),
    ({"model": "echo"}, {}, "input"),
    ({"input": "x", "model": "echo", "encoding_format": "int8"}, {}, "encoding_format"),
    ({"input": "x", "model": "echo", "temperature": 1}, {}, "temperature"),
    ({"input": "x", "model": "echo", "priority": 101}, {}, "priority"),
    ({"input": "x", "model": "echo", "deadline_s": 0}, {}, "deadline_s"),
    ({"input": "x", "model": "echo"}, {"X-Priority": "high"}, "X-Priority"),
    ({"input": "x", "model": "echo"}, {"X-Deadline-S": "-1"}, "X-Deadline-S"),
    ({"input": "x", "model": "echo"}, {"X-Timeout-S": "100000"}, "X-Timeout-S"),
])
def test_invalid_requests_are_422_naming_the_field(
        api: TestClient, r: redis.Redis, body: dict[str, Any], headers: dict[str, str],
        param: str) -> None:
    response = api.post("/v1/embeddings", json=body, headers=headers)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert param in error["message"]
    assert error["type"] == "invalid_request_error"
    assert r.zcard(ECHO.pending) == 0  # nothing queued


@pytest.mark.parametrize(("field", "value"), [("dimensions", 128),
                                              ("truncate_prompt_tokens", 16)])
def test_unsupported_fields_are_400_naming_them(api: TestClient, r: redis.Redis, field: str,
                                                value: int) -> None:
    response = api.post("/v1/embeddings", json={"input": "x", "model": "echo", field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter"
    assert error["message"].startswith(f"{field}: not supported: ")
    assert r.zcard(ECHO.pending) == 0


def test_too_many_inputs_is_422(make_api: MakeApi) -> None:
    with make_api(max_embedding_inputs=2) as api:
        response = api.post("/v1/embeddings", json={"input": ["a", "b", "c"], "model": "echo"})
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "input"


def test_a_full_queue_is_429_with_retry_after_and_queues_nothing(
        make_api: MakeApi, r: redis.Redis) -> None:
    with make_api(max_queue_depth=1, retry_after_s=3) as api:
        response = api.post("/v1/embeddings", json={"input": ["a", "b"], "model": "echo"})
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "3"
        assert response.json()["error"]["code"] == "queue_full"
        # "a" got in before the queue filled; the gateway cancelled it (all or nothing).
        assert r.zcard(ECHO.pending) == 0
        one = api.post("/v1/requests", json={"prompt": "a", "model": "echo"})
        again = api.post("/v1/embeddings", json={"input": "b", "model": "echo"})
    assert one.status_code == 202
    assert again.status_code == 429 and int(again.headers["Retry-After"]) >= 1


def test_no_result_in_time_is_504_and_cancels_the_inputs(api: TestClient,
                                                         r: redis.Redis) -> None:
    start = time.monotonic()
    response = api.post("/v1/embeddings", json={"input": ["a", "b", "c"], "model": "echo"},
                        headers={"X-Timeout-S": "0.3"})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "result_timeout"
    assert 0.3 <= time.monotonic() - start < 5
    # Nobody will read these any more: they must not wait for a worker.
    assert r.zcard(ECHO.pending) == 0
    assert r.hget(ECHO.stats, "cancelled") == b"3"


def test_a_worker_side_failure_is_mapped_with_its_code(
        api: TestClient, r: redis.Redis) -> None:
    """One input fails (here: dead-lettered, ``max_attempts``): 502 with the worker's code,
    ``param`` naming the input, and the other input cancelled. The test plays the worker:
    it writes the failure result and announces it in the gateway's inbox, as the scripts do
    (``e2e/test_gateway_with_workers`` reaches ``max_attempts`` with real workers)."""
    from inferq.protocol.codec import ErrorInfo, Result, Status, encode_result

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(api.post, "/v1/embeddings",
                              json={"input": ["a", "b"], "model": "echo"})
        deadline = time.monotonic() + 10
        while r.zcard(ECHO.pending) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        (raw_id,) = r.zrange(ECHO.pending, 0, 0)
        assert isinstance(raw_id, bytes)
        first = raw_id.decode()
        result = Result(id=first, status=Status.DEAD,
                        error=ErrorInfo(code="max_attempts", message="lease expired"))
        inbox = r.hget(ECHO.request(first), "rt")
        assert isinstance(inbox, bytes)
        body = encode_result(result)
        r.rpush(ECHO.result(first), body)
        r.rpush(ECHO.inbox(inbox.decode()), first.encode() + b" " + body)
        response = pending.result(timeout=30)
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["code"], error["param"], error["request_id"]) == ("max_attempts",
                                                                     "input[0]", first)
    assert r.zcard(ECHO.pending) == 0  # the other input was cancelled
