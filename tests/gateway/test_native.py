"""The native request API: create (202 / wait), read, cancel, priorities, deadlines, and the
errors a finished request stands for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from fastapi.testclient import TestClient

from inferq.protocol import scores
from inferq.protocol.keys import QueueKeys
from tests.conftest import WorkerProcess, wait_until

ECHO = QueueKeys.for_model("embed", "echo")
StartWorker = Callable[..., WorkerProcess]


def state_of(api: TestClient, request_id: str, model: str = "echo") -> str:
    status: str = api.get(f"/v1/requests/{request_id}", params={"model": model}).json()["status"]
    return status


def test_create_then_read_until_done(api: TestClient, start_worker: StartWorker) -> None:
    created = api.post("/v1/requests", json={"prompt": "hello", "model": "echo"})
    assert created.status_code == 202
    body = created.json()
    assert body == {"id": body["id"], "queue": "embed:echo", "status": "pending",
                    "duplicate": False, "result": None}
    assert state_of(api, body["id"]) == "pending"
    start_worker("--model", "echo")
    wait_until(lambda: state_of(api, body["id"]) == "ok", what="request done")
    done = api.get(f"/v1/requests/{body['id']}?model=echo&task=embed").json()
    result = done["result"]
    assert result["output"] == "hello" and result["status"] == "ok"
    assert result["attempts"] == 1 and result["batch_size"] >= 1
    assert result["queue_wait_ms"] >= 0 and result["compute_ms"] >= 0


def test_wait_returns_the_result(api: TestClient, start_worker: StartWorker) -> None:
    start_worker("--model", "echo", "--task", "classify")
    response = api.post("/v1/requests?wait=true&timeout_s=60",
                        json={"prompt": "echo me", "model": "echo", "task": "classify",
                              "params": {"max_tokens": 3}})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["queue"] == "classify:echo"
    assert body["result"]["output"] == "echo me"


def test_a_repeated_id_returns_the_existing_request(api: TestClient,
                                                    start_worker: StartWorker) -> None:
    first = api.post("/v1/requests", json={"prompt": "one", "model": "echo", "id": "job-1"})
    again = api.post("/v1/requests", json={"prompt": "two", "model": "echo", "id": "job-1"})
    assert first.status_code == again.status_code == 202
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    assert again.json()["status"] == "pending"
    start_worker("--model", "echo")
    # Waiting on someone else's request (no inbox of ours): the blocking path.
    waited = api.post("/v1/requests?wait=true",
                      json={"prompt": "three", "model": "echo", "id": "job-1"})
    assert waited.status_code == 200
    assert waited.json()["result"]["output"] == "one"
    done = api.post("/v1/requests", json={"prompt": "four", "model": "echo", "id": "job-1"})
    assert done.json()["status"] == "ok" and done.json()["result"]["output"] == "one"


def test_cancel(api: TestClient, r: redis.Redis) -> None:
    request_id = api.post("/v1/requests", json={"prompt": "x", "model": "echo"}).json()["id"]
    cancelled = api.delete(f"/v1/requests/{request_id}?model=echo")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["result"]["error"]["code"] == "cancelled"
    assert r.zcard(ECHO.pending) == 0
    assert state_of(api, request_id) == "cancelled"
    again = api.delete(f"/v1/requests/{request_id}?model=echo")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_finished"
    # Waiting on a cancelled request is the SDK's RequestCancelled: 409.
    waited = api.post("/v1/requests?wait=true",
                      json={"prompt": "x", "model": "echo", "id": request_id})
    assert waited.status_code == 409
    assert waited.json()["error"] | {"message": ""} == {
        "message": "", "type": "conflict_error", "code": "cancelled", "param": None,
        "request_id": request_id}


def test_unknown_and_malformed_ids(api: TestClient) -> None:
    for method in ("GET", "DELETE"):
        missing = api.request(method, "/v1/requests/nope?model=echo")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        bad = api.request(method, "/v1/requests/bad%20id?model=echo")
        assert bad.status_code == 422 and bad.json()["error"]["param"] == "request_id"
    no_model = api.get("/v1/requests/abc")
    assert no_model.status_code == 422 and no_model.json()["error"]["param"] == "model"


def _priority(r: redis.Redis, request_id: str) -> int:
    score = r.zscore(ECHO.pending, request_id)
    assert score is not None
    return scores.decode(score)[0]


def test_priority_and_deadline_from_headers_unless_the_body_says(
        api: TestClient, r: redis.Redis) -> None:
    def create(headers: dict[str, str], **fields: Any) -> str:
        response = api.post("/v1/requests", json={"prompt": "p", "model": "echo", **fields},
                            headers=headers)
        assert response.status_code == 202, response.text
        request_id: str = response.json()["id"]
        return request_id

    plain = create({})
    header = create({"X-Priority": "7", "X-Deadline-S": "30"})
    field = create({"X-Priority": "7", "X-Deadline-S": "30"}, priority=-2, deadline_s=600)
    assert [_priority(r, i) for i in (plain, header, field)] == [0, 7, -2]
    assert r.hget(ECHO.request(plain), "dl") is None
    enqueued = int(r.hget(ECHO.request(header), "eq") or 0)
    assert int(r.hget(ECHO.request(header), "dl") or 0) - enqueued == 30_000
    assert int(r.hget(ECHO.request(field), "dl") or 0) - enqueued >= 600_000 - 5_000


def test_invalid_bodies_name_the_field(api: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "echo"}, "prompt"),
        ({"prompt": "p", "model": "echo", "priority": True}, "priority"),
        ({"prompt": "p", "model": "echo", "id": "has space"}, "id"),
        ({"prompt": "p", "model": "echo", "task": "a/b"}, "task"),
        ({"prompt": "p", "model": "echo", "max_attempts": 0}, "max_attempts"),
        ({"prompt": "p", "model": "echo", "extra": 1}, "extra"),
        ({"prompt": "p", "model": "echo", "params": {"a": {"b": {"c": 1}}}}, "params"),
    ]
    for body, param in cases:
        response = api.post("/v1/requests", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["param"] == param, body


def test_a_wait_that_times_out_is_504_and_leaves_the_request_queued(
        api: TestClient, r: redis.Redis) -> None:
    response = api.post("/v1/requests?wait=true&timeout_s=0.2",
                        json={"prompt": "p", "model": "echo"})
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "result_timeout"
    assert r.zscore(ECHO.pending, error["request_id"]) is not None
    assert state_of(api, error["request_id"]) == "pending"


def test_a_dead_lettered_request_reads_dead_and_waits_as_502(
        api: TestClient, start_worker: StartWorker) -> None:
    """A worker dies holding the request's only attempt; the next worker's reclaim sweep
    dead-letters it (``max_attempts``): GET says so, a wait maps it to 502."""
    sleepy = "sleep=builtin:sleep?batch_ms=60000"
    created = api.post("/v1/requests", json={"prompt": "p", "model": "sleep",
                                             "max_attempts": 1, "id": "doomed"})
    assert created.status_code == 202
    first = start_worker("--model", sleepy, "--lease-ms", "1000")
    wait_until(lambda: state_of(api, "doomed", "sleep") == "running", what="claimed")
    first.proc.kill()
    first.proc.wait()
    time.sleep(1.2)  # the lease runs out
    start_worker("--model", sleepy, "--lease-ms", "1000")
    wait_until(lambda: state_of(api, "doomed", "sleep") == "dead", what="dead-lettered")
    body = api.get("/v1/requests/doomed?model=sleep").json()
    assert body["result"]["error"]["code"] == "max_attempts"
    waited = api.post("/v1/requests?wait=true",
                      json={"prompt": "p", "model": "sleep", "id": "doomed"})
    assert waited.status_code == 502
    assert waited.json()["error"]["code"] == "max_attempts"
    assert waited.json()["error"]["request_id"] == "doomed"


def test_status_codes_in_the_schema(api: TestClient) -> None:
    responses = api.get("/openapi.json").json()["paths"]["/v1/requests"]["post"]["responses"]
    assert {"200", "202", "422", "429", "504"} <= set(responses)
