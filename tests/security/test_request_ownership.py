"""Every request belongs to the tenant that made it: another tenant cannot read, cancel,
resume or squat it, and cannot tell it exists. An admin key sees everything."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from inferq.protocol.keys import QueueKeys
from tests.security.conftest import Tenants

BODY = {"prompt": "hi", "model": "echo"}
ECHO = QueueKeys.for_model("embed", "echo")


def test_another_tenants_request_is_a_404_for_read_cancel_and_resume(
        keyed_api: TestClient, tenants: Tenants) -> None:
    acme, globex = Tenants.bearer(tenants.acme), Tenants.bearer(tenants.globex)
    made = keyed_api.post("/v1/requests", json={**BODY, "id": "victim-42"}, headers=acme)
    assert made.status_code == 202
    generated = keyed_api.post("/v1/requests", json=BODY, headers=acme).json()["id"]
    for request_id in ("victim-42", generated):
        mine = keyed_api.get(f"/v1/requests/{request_id}?model=echo", headers=acme)
        assert mine.status_code == 200 and mine.json()["id"] == request_id
        theirs = keyed_api.get(f"/v1/requests/{request_id}?model=echo", headers=globex)
        never = keyed_api.get("/v1/requests/never-was?model=echo", headers=globex)
        assert theirs.status_code == never.status_code == 404
        assert theirs.json()["error"]["code"] == never.json()["error"]["code"] == "not_found"
        assert "acme" not in theirs.text
        stream = keyed_api.get(f"/v1/requests/{request_id}/stream?model=echo", headers=globex)
        assert stream.status_code == 404
        cancel = keyed_api.delete(f"/v1/requests/{request_id}?model=echo", headers=globex)
        assert cancel.status_code == 404
        # ...and the victim's request is untouched by all of that
        assert keyed_api.get(f"/v1/requests/{request_id}?model=echo",
                             headers=acme).json()["status"] == "pending"


def test_an_id_cannot_be_squatted_by_another_tenant(
        keyed_api: TestClient, tenants: Tenants, r: redis.Redis) -> None:
    acme, globex = Tenants.bearer(tenants.acme), Tenants.bearer(tenants.globex)
    squat = keyed_api.post("/v1/requests", headers=globex,
                           json={"prompt": "attacker's", "model": "echo", "id": "victim-42"})
    assert squat.status_code == 202 and squat.json()["duplicate"] is False
    victim = keyed_api.post("/v1/requests", headers=acme,
                            json={"prompt": "victim's", "model": "echo", "id": "victim-42"})
    assert victim.status_code == 202, victim.text
    assert victim.json()["duplicate"] is False  # its own request, not the attacker's
    assert r.exists(ECHO.request("acme@victim-42"), ECHO.request("globex@victim-42")) == 2
    # within one tenant the id is still an idempotency key
    again = keyed_api.post("/v1/requests", headers=acme,
                           json={"prompt": "victim's", "model": "echo", "id": "victim-42"})
    assert again.json()["duplicate"] is True and again.json()["id"] == "victim-42"


def test_an_admin_key_sees_every_tenants_requests(keyed_api: TestClient,
                                                  tenants: Tenants) -> None:
    keyed_api.post("/v1/requests", json={**BODY, "id": "r1"}, headers=Tenants.bearer(tenants.acme))
    admin = Tenants.bearer(tenants.admin)
    found = keyed_api.get("/admin/requests/acme@r1", headers=admin)
    assert found.status_code == 200 and found.json()["state"] == "pending"
    assert keyed_api.get("/admin/requests/acme@r1",
                         headers=Tenants.bearer(tenants.globex)).status_code == 403


def test_a_tenants_ids_stay_its_own_in_every_answer(keyed_api: TestClient,
                                                     tenants: Tenants) -> None:
    acme = Tenants.bearer(tenants.acme)
    chat = keyed_api.post("/v1/chat/completions", headers={**acme, "X-Request-Id": "c1",
                                                            "X-Timeout-S": "0.2"},
                          json={"model": "echo", "messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 504  # no worker: it times out, and is cancelled
    assert chat.json()["error"]["request_id"] == "c1"
    assert keyed_api.get("/v1/requests/c1?model=echo&task=generate",
                         headers=acme).json()["status"] == "cancelled"
