"""A batch's lines run under its owner's per-tenant limits, shared with the tenant's online
calls: lines over the requests/min limit wait for the bucket (no line fails), are admitted no
faster than it refills, and are settled on their results; online calls of the same tenant
meanwhile meet the same empty bucket; another tenant is unaffected. Through the real front
door, with real keys, and the test playing the worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from inferq.batch.envelope import line_request_id
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, encode_result
from inferq.protocol.keys import TenancyKeys
from inferq.tenancy import KeyStore
from tests.support.batch import EMBED, TTL_MS, embed_line, jsonl, read_jsonl, vector_of
from tests.support.processes import wait_until

RPM = 60
EXTRA = 3


@pytest.fixture
def api(redis_url: str, tmp_path: Path) -> Iterator[TestClient]:
    from inferq.gateway import GatewaySettings, create_app

    app = create_app(GatewaySettings(redis_url=redis_url, token="op-token", timeout_s=30.0,
                                     require_served_model=False,
                                     file_store=str(tmp_path / "files"), batch_idle_s=0.1))
    with TestClient(app) as client:
        yield client


def bearer(store: KeyStore, tenant: str, **limits: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {store.create(tenant, **limits).secret}"}


class Worker:
    """Claims what waits and answers it, noting when each request was queued (Redis ms)."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.scripts = ops.register(r)
        self.queued_ms: dict[str, int] = {}

    def pump(self) -> None:
        k, a = ops.claim_call(EMBED, "w", 30_000, 1000, TTL_MS)
        claimed = ops.parse_claim(self.scripts["claim"](keys=k, args=a)).claimed
        done = []
        for c in claimed:
            self.queued_ms[c.id] = c.enqueued_ms
            body = encode_result(Result(id=c.id, status=Status.OK, output=vector_of("x"),
                                        attempts=c.attempt, input_tokens=1))
            done.append(ops.Completion(c, "ok", body, prompt_tokens=1))
        if done:
            k, a = ops.complete_call(EMBED, TTL_MS, 100, done)
            assert all(ops.parse_complete(self.scripts["complete"](keys=k, args=a)))


def online(api: TestClient, headers: dict[str, str], text: str) -> Any:
    return api.post("/v1/requests", headers=headers,
                    json={"prompt": text, "model": "echo", "task": "embed"})


def test_batch_lines_wait_for_the_tenants_bucket_which_online_calls_share(
        api: TestClient, r: redis.Redis, tmp_path: Path) -> None:
    store = KeyStore(r)
    alice = bearer(store, "alice", requests_per_minute=RPM, max_in_flight=1000)
    bob = bearer(store, "bob", requests_per_minute=RPM)
    rows = [embed_line(f"line-{i:03d}", f"text {i}") for i in range(RPM + EXTRA)]
    upload = api.post("/v1/files", files={"file": ("in.jsonl", jsonl(rows))},
                      data={"purpose": "batch"}, headers=alice)
    batch = api.post("/v1/batches", headers=alice, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings",
        "completion_window": "24h"}).json()
    worker = Worker(r)
    line_ids = {"alice@" + line_request_id(batch["id"], row["custom_id"]) for row in rows}

    def queued() -> int:
        worker.pump()
        return len(line_ids & worker.queued_ms.keys())

    # The bucket holds a minute's worth: RPM lines go at once, then the batch waits for it.
    wait_until(lambda: queued() >= RPM, what="the first minute's worth of lines")
    assert queued() == RPM
    # Meanwhile the tenant's online calls meet the same empty bucket ...
    refused = online(api, alice, "online while the batch waits")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "requests"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    # ... and another tenant's do not.
    admitted = online(api, bob, "bob is not affected")
    assert admitted.status_code == 202, admitted.text
    assert admitted.headers["x-ratelimit-remaining-requests"] == str(RPM - 1)

    def finished() -> bool:
        worker.pump()
        got = api.get(f"/v1/batches/{batch['id']}", headers=alice).json()
        return bool(got["status"] == "completed")

    wait_until(finished, timeout=60, what="the batch completed")
    done = api.get(f"/v1/batches/{batch['id']}", headers=alice).json()
    assert done["request_counts"] == {"total": RPM + EXTRA, "completed": RPM + EXTRA,
                                      "failed": 0}
    content = api.get(f"/v1/files/{done['output_file_id']}/content", headers=alice).content
    assert len(read_jsonl(content)) == RPM + EXTRA
    # No faster than the bucket refills: line RPM + m was queued at least m minutes / RPM
    # after the first (less the few ms between an admission and its enqueue).
    times = sorted(worker.queued_ms[i] for i in line_ids)
    for m in range(1, EXTRA + 1):
        assert times[RPM - 1 + m] - times[0] >= m * 60_000 // RPM - 50, (m, times[-EXTRA - 1:])
    # Every line's reservation was settled on its result: nothing is left in flight.
    names = TenancyKeys("inferq")
    assert r.zcard(names.in_flight("alice")) == 0
    assert r.hlen(names.queued_bytes("alice")) == 0


def create_batch(api: TestClient, headers: dict[str, str], rows: list[dict[str, Any]]) -> Any:
    upload = api.post("/v1/files", files={"file": ("in.jsonl", jsonl(rows))},
                      data={"purpose": "batch"}, headers=headers)
    return api.post("/v1/batches", headers=headers, json={
        "input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings",
        "completion_window": "24h"}).json()


def test_a_line_larger_than_the_tokens_per_minute_fails_alone(
        api: TestClient, r: redis.Redis) -> None:
    alice = bearer(KeyStore(r), "alice", tokens_per_minute=50)
    rows = [embed_line("small-1", "x" * 40), embed_line("huge", "x" * 400),  # 100 tokens
            embed_line("small-2", "x" * 40)]
    batch = create_batch(api, alice, rows)
    worker = Worker(r)

    def finished() -> bool:
        worker.pump()
        return bool(api.get(f"/v1/batches/{batch['id']}", headers=alice).json()["status"]
                    == "completed")

    wait_until(finished, what="the batch completed")
    done = api.get(f"/v1/batches/{batch['id']}", headers=alice).json()
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    (error,) = read_jsonl(api.get(f"/v1/files/{done['error_file_id']}/content",
                                  headers=alice).content)
    assert error["custom_id"] == "huge" and error["response"]["status_code"] == 429
    body = error["response"]["body"]["error"]
    assert body["code"] == "tokens" and "tokens per minute (50)" in body["message"]


def test_a_cancel_gives_back_the_reservations_of_the_lines_it_withdraws(
        api: TestClient, r: redis.Redis) -> None:
    alice = bearer(KeyStore(r), "alice", max_in_flight=100)
    names = TenancyKeys("inferq")
    batch = create_batch(api, alice, [embed_line(f"l{i}", "x") for i in range(5)])
    wait_until(lambda: r.zcard(EMBED.pending) == 5, what="the lines queued")
    assert r.zcard(names.in_flight("alice")) == 5  # each line holds a slot while it waits
    assert api.post(f"/v1/batches/{batch['id']}/cancel", headers=alice).status_code == 200
    wait_until(lambda: api.get(f"/v1/batches/{batch['id']}", headers=alice).json()["status"]
               == "cancelled", what="the batch cancelled")
    assert r.zcard(EMBED.pending) == 0
    assert r.zcard(names.in_flight("alice")) == 0
    assert r.hlen(names.queued_bytes("alice")) == 0
