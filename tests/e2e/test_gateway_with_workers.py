"""The gateway in front of real ``inferq worker`` processes: readiness, the native request API
from creation to result (and to a dead letter), and embeddings that a worker answers late or
without vectors (``echo`` answers with the text itself)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis
from fastapi.testclient import TestClient

from inferq.protocol.keys import QueueKeys
from tests.support.gateway import state_of
from tests.support.processes import WorkerProcess, wait_until

StartWorker = Callable[..., WorkerProcess]


def test_readyz_needs_a_live_worker_on_the_queue(
        api: TestClient, start_worker: Callable[..., WorkerProcess]) -> None:
    before = api.get("/readyz", params={"model": "echo", "task": "embed"})
    assert before.status_code == 503
    assert before.json() == {"status": "unready", "queue": "embed:echo", "redis": True,
                             "live_workers": 0, "reason": "no live worker on queue embed:echo"}
    start_worker("--model", "echo")
    wait_until(lambda: api.get("/readyz?model=echo").status_code == 200, what="readyz 200")
    after = api.get("/readyz?model=echo").json()
    assert after["status"] == "ready" and after["live_workers"] == 1
    # The default queue (minilm) has no worker: still unready.
    assert api.get("/readyz").status_code == 503
    assert api.get("/readyz").json()["queue"] == "embed:minilm"


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


def test_a_dead_lettered_request_reads_dead_and_waits_as_502(
        api: TestClient, start_worker: StartWorker, r: redis.Redis) -> None:
    """A worker dies running the request alone, with a crash budget of one
    (``--max-crashes 1``); the next worker's reclaim sweep dead-letters it
    (``crashed_worker``): GET says so, a wait maps it to 502."""
    sleepy = "sleep=builtin:sleep?batch_ms=60000"
    created = api.post("/v1/requests", json={"prompt": "p", "model": "sleep",
                                             "max_attempts": 1, "id": "doomed"})
    assert created.status_code == 202
    first = start_worker("--model", sleepy, "--lease-ms", "1000", "--max-crashes", "1")
    wait_until(lambda: state_of(api, "doomed", "sleep") == "running", what="claimed")
    # its model started it (a claim that never ran would cost no attempt)
    started = QueueKeys.for_model("embed", "sleep").started
    wait_until(lambda: r.sismember(started, "doomed"), what="started")
    first.proc.kill()
    first.proc.wait()
    time.sleep(1.2)  # the lease runs out
    start_worker("--model", sleepy, "--lease-ms", "1000", "--max-crashes", "1")
    wait_until(lambda: state_of(api, "doomed", "sleep") == "dead", what="dead-lettered")
    body = api.get("/v1/requests/doomed?model=sleep").json()
    assert body["result"]["error"]["code"] == "crashed_worker"
    waited = api.post("/v1/requests?wait=true",
                      json={"prompt": "p", "model": "sleep", "id": "doomed"})
    assert waited.status_code == 502
    assert waited.json()["error"]["code"] == "crashed_worker"
    assert waited.json()["error"]["request_id"] == "doomed"


def test_a_passed_deadline_is_504_deadline_exceeded(
        api: TestClient, start_worker: Callable[..., WorkerProcess]) -> None:
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(api.post, "/v1/embeddings",
                              json={"input": ["a", "b"], "model": "echo"},
                              headers={"X-Deadline-S": "0.2"})
        time.sleep(0.5)  # the deadline passes while no worker exists
        start_worker("--model", "echo")
        response = pending.result(timeout=60)
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded"
    assert error["param"] in ("input[0]", "input[1]")
    assert error["request_id"]


def test_a_model_that_returns_no_vectors_is_502(
        api: TestClient, start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--model", "echo")
    response = api.post("/v1/embeddings", json={"input": ["hello", "world"], "model": "echo"})
    assert response.status_code == 502
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_output", "input[0]")
    assert "not a vector" in error["message"]
