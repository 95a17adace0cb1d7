"""Files and batches belong to the tenant that made them: another tenant gets the 404 of a
thing that does not exist, lists and stats show a tenant its own, the operator and admin keys
see everything; a batch's lines run as its owner's requests (tenant, ids in its name space)
within the creating key's priority ceiling. Through the real front door, with real keys."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from inferq.batch.envelope import line_request_id
from inferq.protocol import scores
from inferq.protocol.fields import Field
from inferq.tenancy import KeyStore
from tests.support.batch import (
    EMBED,
    answer,
    embed_line,
    jsonl,
    read_jsonl,
    wait_status,
)
from tests.support.processes import wait_until

OPERATOR_TOKEN = "op-token"


@dataclass
class Who:
    """Bearer headers of real keys (``inferq keys``) and of the operator's token."""

    store: KeyStore

    def key(self, tenant: str, *, scopes: str = "api",
            max_priority: int | None = None) -> dict[str, str]:
        made = self.store.create(tenant, scopes=scopes.split(","), max_priority=max_priority)
        return {"Authorization": f"Bearer {made.secret}"}

    def __post_init__(self) -> None:
        self.alice = self.key("alice")
        self.bob = self.key("bob")
        self.admin = self.key("ops", scopes="api,admin")
        self.operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture
def who(r: redis.Redis) -> Who:
    return Who(KeyStore(r))


@pytest.fixture
def api(redis_url: str, tmp_path: Path) -> Iterator[TestClient]:
    from inferq.gateway import GatewaySettings, create_app

    app = create_app(GatewaySettings(redis_url=redis_url, token=OPERATOR_TOKEN, timeout_s=30.0,
                                     require_served_model=False,
                                     file_store=str(tmp_path / "files"), batch_idle_s=0.2))
    with TestClient(app) as client:
        yield client


def upload(api: TestClient, headers: dict[str, str], data: bytes) -> str:
    response = api.post("/v1/files", files={"file": ("in.jsonl", data)},
                        data={"purpose": "batch"}, headers=headers)
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def create(api: TestClient, headers: dict[str, str], file_id: str, **extra: Any) -> Any:
    return api.post("/v1/batches", headers=headers, json={
        "input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h",
        **extra})


def ids(api: TestClient, path: str, headers: dict[str, str], **params: Any) -> list[str]:
    response = api.get(path, headers=headers, params=params)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["data"]]


def missing(api: TestClient, method: str, path: str, headers: dict[str, str],
            real_id: str, fake_id: str) -> None:
    """``path`` answers ``headers``'s caller exactly as for an id that does not exist."""
    theirs = api.request(method, path.format(real_id), headers=headers)
    none = api.request(method, path.format(fake_id), headers=headers)
    assert theirs.status_code == none.status_code == 404, theirs.text
    assert theirs.json() == none.json() | {"error": {
        **none.json()["error"], "message": none.json()["error"]["message"].replace(
            fake_id, real_id)}}


def test_a_tenant_cannot_tell_another_tenants_file_exists(api: TestClient, who: Who) -> None:
    mine = upload(api, who.alice, jsonl([embed_line("a", "x")]))
    theirs = upload(api, who.bob, jsonl([embed_line("a", "y")]))
    for method, path in (("GET", "/v1/files/{}"), ("GET", "/v1/files/{}/content"),
                         ("DELETE", "/v1/files/{}")):
        missing(api, method, path, who.bob, mine, "file-000000000000000000000000")
    assert ids(api, "/v1/files", who.alice) == [mine]
    assert ids(api, "/v1/files", who.bob) == [theirs]
    assert ids(api, "/v1/files", who.bob, after=mine) == []  # no paging through another's
    assert ids(api, "/v1/files", who.admin) == [theirs, mine]
    assert ids(api, "/v1/files", who.operator) == [theirs, mine]  # the operator
    assert api.get(f"/v1/files/{mine}/content", headers=who.admin).status_code == 200
    assert api.get(f"/v1/files/{mine}/content", headers=who.alice).content == jsonl(
        [embed_line("a", "x")])
    assert api.delete(f"/v1/files/{mine}", headers=who.alice).json()["deleted"] is True
    assert ids(api, "/v1/files", who.admin) == [theirs]
    # a tenant cannot make a batch of another's file: the same 404 as for none
    refused = create(api, who.alice, theirs)
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "input_file_id"


def test_a_batch_belongs_to_its_tenant_and_runs_as_its_requests(
        api: TestClient, r: redis.Redis, who: Who) -> None:
    rows = [embed_line("same-id", "alice's text"), embed_line("bad", "")]
    mine = create(api, who.alice, upload(api, who.alice, jsonl(rows))).json()
    # Bob's batch uses the same custom_id: the two never collide.
    bob_file = upload(api, who.bob, jsonl([embed_line("same-id", "bob's")]))
    theirs = create(api, who.bob, bob_file).json()
    for method, path in (("GET", "/v1/batches/{}"), ("POST", "/v1/batches/{}/cancel")):
        missing(api, method, path, who.bob, mine["id"], "batch_000000000000000000000000")
    assert ids(api, "/v1/batches", who.alice) == [mine["id"]]
    assert ids(api, "/v1/batches", who.bob) == [theirs["id"]]
    assert ids(api, "/v1/batches", who.bob, after=mine["id"]) == []
    assert ids(api, "/v1/batches", who.admin) == ids(api, "/v1/batches", who.operator) == [
        theirs["id"], mine["id"]]
    stats = api.get("/v1/batches/stats", headers=who.bob).json()
    assert [b["id"] for b in stats["active"]] == [theirs["id"]]
    assert sum(stats["batches"].values()) == 1
    # The lines are each owner's requests: its tenant, ids in its name space.
    alice_line = "alice@" + line_request_id(mine["id"], "same-id")
    bob_line = "bob@" + line_request_id(theirs["id"], "same-id")
    wait_until(lambda: r.zcard(EMBED.pending) == 2, what="both batches' lines queued")
    assert {m.decode() for m in r.zrange(EMBED.pending, 0, -1)} == {alice_line, bob_line}
    assert r.hget(EMBED.request(alice_line), Field.TENANT) == b"alice"
    assert r.hget(EMBED.request(bob_line), Field.TENANT) == b"bob"
    answer(r)
    done = wait_status(lambda: api.get(f"/v1/batches/{mine['id']}", headers=who.alice).json(),
                       "completed")
    wait_status(lambda: api.get(f"/v1/batches/{theirs['id']}", headers=who.bob).json(),
                "completed")
    # Its output and error files are the owner's, naming lines by the ids it knows.
    for file_id in (done["output_file_id"], done["error_file_id"]):
        missing(api, "GET", "/v1/files/{}/content", who.bob, file_id,
                "file-000000000000000000000000")
        assert file_id in ids(api, "/v1/files", who.alice)
        assert file_id not in ids(api, "/v1/files", who.bob)
    content = api.get(f"/v1/files/{done['output_file_id']}/content", headers=who.alice)
    (line,) = read_jsonl(content.content)
    assert line["custom_id"] == "same-id"
    assert line["response"]["request_id"] == line_request_id(mine["id"], "same-id")
    errors = api.get(f"/v1/files/{done['error_file_id']}/content", headers=who.alice)
    (error,) = read_jsonl(errors.content)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 422
    assert api.post(f"/v1/batches/{mine['id']}/cancel", headers=who.alice).status_code == 409


def priority_of_waiting(r: redis.Redis) -> int:
    (_, score), = r.zrange(EMBED.pending, 0, 0, withscores=True)
    return scores.PRIORITY_MAX - (int(score) >> scores.SEQ_BITS)


def test_batch_lines_stay_within_the_keys_priority_ceiling(
        api: TestClient, r: redis.Redis, who: Who) -> None:
    capped = who.key("alice", max_priority=-60)
    file_id = upload(api, capped, jsonl([embed_line("a", "x")]))
    above = create(api, capped, file_id, metadata={"priority": "-10"})
    assert above.status_code == 403, above.text
    error = above.json()["error"]
    assert error["type"] == "permission_error" and error["param"] == "metadata"
    assert error["code"] == "priority_not_allowed" and "max_priority -60" in error["message"]
    assert ids(api, "/v1/batches", capped) == []
    # The default (-50) is lowered to the ceiling, not refused.
    batch = create(api, capped, file_id).json()
    assert batch["inferq"]["priority"] == -60
    wait_until(lambda: r.zcard(EMBED.pending) == 1, what="the line queued")
    assert priority_of_waiting(r) == -60
    answer(r)
    wait_status(lambda: api.get(f"/v1/batches/{batch['id']}", headers=capped).json(),
                "completed")
    # Within the ceiling, metadata.priority is the caller's to choose.
    within = create(api, capped, file_id, metadata={"priority": "-70"}).json()
    assert within["inferq"]["priority"] == -70
    wait_until(lambda: r.zcard(EMBED.pending) == 1, what="the line queued")
    assert priority_of_waiting(r) == -70
