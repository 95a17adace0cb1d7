"""Keys bound to tenants: the key decides the tenant and the ceiling, scopes decide the
routes, a revoked key is refused everywhere within a second, and no gateway is open once a
key exists. Each test carried out an attack that succeeded before tenant keys."""

from __future__ import annotations

import time

import redis
from fastapi.testclient import TestClient

from inferq.cli.main import main
from inferq.protocol.codec import decode_request
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys, TenancyKeys
from inferq.tenancy import KeyStore
from tests.security.conftest import Tenants
from tests.support.gateway import TOKEN, MakeApi

BODY = {"prompt": "hi", "model": "echo"}
ECHO = QueueKeys.for_model("embed", "echo")


def payload_tenant(r: redis.Redis, stored_id: str) -> str | None:
    raw = r.hget(ECHO.request(stored_id), Field.PAYLOAD)
    assert raw is not None, f"no request {stored_id}"
    return decode_request(raw).tenant


def test_redis_keeps_only_a_hash_of_the_secret(r: redis.Redis, tenants: Tenants) -> None:
    names = TenancyKeys()
    dump = b"".join(v for k in r.scan_iter(match=names.prefix + "*")
                    for v in ([r.dump(k) or b""]))
    assert tenants.acme.secret.encode() not in dump
    assert tenants.acme.secret[10:].encode() not in dump
    listed = {k.id: k for k in tenants.store.list()}
    assert listed[tenants.acme.key.id].tenant == "acme"
    assert listed[tenants.acme.key.id].max_priority == 5


def test_the_key_decides_the_tenant_not_the_body_or_a_header(
        make_api: MakeApi, tenants: Tenants, r: redis.Redis) -> None:
    with make_api(tenant_from="header") as api:
        made = api.post("/v1/requests", json={**BODY, "tenant": "globex", "id": "t1"},
                        headers={**Tenants.bearer(tenants.acme), "X-Inferq-Tenant": "globex"})
        assert made.status_code == 202, made.text
        assert made.json()["id"] == "t1"
        assert payload_tenant(r, "acme@t1") == "acme"
        # the operator's token may still name a tenant (from where the operator said)
        op = api.post("/v1/requests", json={**BODY, "id": "t2"},
                      headers={"Authorization": f"Bearer {TOKEN}", "X-Inferq-Tenant": "x"})
        assert op.status_code == 401  # no token configured: only keys
    with make_api(token=TOKEN, tenant_from="header") as api:
        op = api.post("/v1/requests", json={**BODY, "id": "t2"},
                      headers={"Authorization": f"Bearer {TOKEN}", "X-Inferq-Tenant": "x"})
        assert op.status_code == 202 and payload_tenant(r, "t2") == "x"


def test_a_priority_above_the_keys_ceiling_is_a_403_naming_it(
        keyed_api: TestClient, tenants: Tenants) -> None:
    acme = Tenants.bearer(tenants.acme)
    for attempt in ({"json": {**BODY, "priority": 100}, "headers": acme},
                    {"json": BODY, "headers": {**acme, "X-Priority": "6"}}):
        refused = keyed_api.post("/v1/requests", **attempt)  # type: ignore[arg-type]
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "priority_not_allowed" and "max_priority 5" in error["message"]
    embed = keyed_api.post("/v1/embeddings", json={"input": "x", "model": "echo",
                                                   "priority": 9}, headers=acme)
    assert embed.status_code == 403
    chat = keyed_api.post("/v1/chat/completions", headers=acme, json={
        "model": "echo", "messages": [{"role": "user", "content": "x"}], "priority": 50})
    assert chat.status_code == 403
    ok = keyed_api.post("/v1/requests", json={**BODY, "priority": 5}, headers=acme)
    assert ok.status_code == 202


def test_scopes_decide_the_routes(keyed_api: TestClient, tenants: Tenants,
                                  r: redis.Redis) -> None:
    store = KeyStore(r)
    autoscaler = Tenants.bearer(store.create("keda", scopes=["autoscale"]))
    api_key = Tenants.bearer(tenants.acme)
    admin = Tenants.bearer(tenants.admin)
    assert keyed_api.get("/admin/overview", headers=api_key).status_code == 403
    assert keyed_api.post("/admin/queues/embed:echo/dead-letters/purge", json={"all": True},
                          headers=api_key).status_code == 403
    assert keyed_api.get("/autoscale", headers=api_key).status_code == 403
    assert keyed_api.get("/autoscale", headers=autoscaler).status_code == 200
    assert keyed_api.get("/metrics/autoscale", headers=autoscaler).status_code == 200
    assert keyed_api.get("/metrics/autoscale").status_code == 401
    assert keyed_api.get("/admin/overview", headers=autoscaler).status_code == 403
    assert keyed_api.post("/v1/requests", json=BODY, headers=autoscaler).status_code == 403
    assert keyed_api.get("/admin/overview", headers=admin).status_code == 200
    assert keyed_api.get("/autoscale", headers=admin).status_code == 200


def test_a_revoked_key_is_refused_within_a_second(keyed_api: TestClient, tenants: Tenants,
                                                  redis_url: str) -> None:
    acme = Tenants.bearer(tenants.acme)
    assert keyed_api.post("/v1/requests", json=BODY, headers=acme).status_code == 202
    assert main(["keys", "revoke", tenants.acme.key.id, "--redis-url", redis_url]) == 0
    revoked_at = time.monotonic()
    while keyed_api.post("/v1/requests", json=BODY, headers=acme).status_code == 202:
        assert time.monotonic() - revoked_at < 1.5, "still admitted 1.5 s after revoke"
    assert keyed_api.post("/v1/requests", json=BODY, headers=acme).status_code == 401
    assert main(["keys", "revoke", tenants.acme.key.id, "--redis-url", redis_url]) == 1


def test_the_first_key_closes_an_open_gateway(make_api: MakeApi, r: redis.Redis) -> None:
    with make_api() as api:
        assert api.post("/v1/requests", json=BODY).status_code == 202  # open: no key yet
        made = KeyStore(r).create("acme")
        closed_at = time.monotonic()
        while api.post("/v1/requests", json=BODY).status_code == 202:
            assert time.monotonic() - closed_at < 1.5, "still open 1.5 s after the first key"
        assert api.post("/v1/requests", json=BODY,
                        headers=Tenants.bearer(made)).status_code == 202


def test_wrong_keys_are_401_and_never_echoed(keyed_api: TestClient, tenants: Tenants) -> None:
    for header in ("Bearer nope", f"Bearer {tenants.acme.secret}x", "Bearer iq_",
                   f"Basic {tenants.acme.secret}", ""):
        answer = keyed_api.post("/v1/requests", json=BODY, headers={"Authorization": header})
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer"
        assert tenants.acme.secret not in answer.text


def test_keys_cli_prints_the_secret_once_and_lists_none(
        redis_url: str, capsys: object) -> None:
    import json

    import pytest
    cap = capsys
    assert isinstance(cap, pytest.CaptureFixture)
    assert main(["keys", "create", "--tenant", "acme", "--scope", "api", "--scope", "admin",
                 "--max-in-flight", "3", "--json", "--redis-url", redis_url]) == 0
    made = json.loads(cap.readouterr().out)
    assert made["secret"].startswith("iq_") and made["scopes"] == ["api", "admin"]
    assert main(["keys", "list", "--redis-url", redis_url]) == 0
    listing = cap.readouterr().out
    assert made["id"] in listing and "max-in-flight=3" in listing
    assert made["secret"] not in listing
    assert main(["keys", "create", "--tenant", "bad name", "--redis-url", redis_url]) != 0
