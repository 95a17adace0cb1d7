"""The native request API with no worker: cancel, unknown and malformed ids, priorities and
deadlines from headers, validation, a wait that times out, the schema."""

from __future__ import annotations

from typing import Any

import redis
from fastapi.testclient import TestClient

from inferq.protocol import scores
from tests.support.gateway import ECHO, state_of


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


def test_status_codes_in_the_schema(api: TestClient) -> None:
    responses = api.get("/openapi.json").json()["paths"]["/v1/requests"]["post"]["responses"]
    assert {"200", "202", "422", "429", "504"} <= set(responses)
