"""Per-tenant limits through the gateway: requests/min, tokens/min and in-flight caps are
429s with Retry-After and OpenAI's x-ratelimit-* headers, successes carry the remaining
counts, a finished request gives its place back, and one tenant's limits never touch
another's. The buckets live in Redis: a second gateway sees the first one's use."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from inferq.protocol.keys import QueueKeys, TenancyKeys
from inferq.tenancy import KeyStore
from tests.security.conftest import Tenants
from tests.support.batch import answer
from tests.support.gateway import MakeApi
from tests.support.processes import wait_until

ECHO = QueueKeys.for_model("embed", "echo")
BODY = {"prompt": "hi", "model": "echo"}


def test_requests_per_minute_is_a_429_with_openais_headers(
        keyed_api: TestClient, make_api: MakeApi, tenants: Tenants, r: redis.Redis) -> None:
    limited = Tenants.bearer(KeyStore(r).create("acme2", requests_per_minute=3))
    remaining = []
    for _ in range(3):
        ok = keyed_api.post("/v1/requests", json=BODY, headers=limited)
        assert ok.status_code == 202, ok.text
        assert ok.headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(int(ok.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    with make_api() as other_gateway:  # the bucket is in Redis: every gateway agrees
        refused = other_gateway.post("/v1/requests", json=BODY, headers=limited)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "requests"
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    # another tenant is not limited by acme2's bucket, and has no such headers
    other = keyed_api.post("/v1/requests", json=BODY, headers=Tenants.bearer(tenants.globex))
    assert other.status_code == 202 and "x-ratelimit-limit-requests" not in other.headers


def test_max_in_flight_counts_unfinished_requests_and_frees_on_finish(
        keyed_api: TestClient, r: redis.Redis) -> None:
    limited = Tenants.bearer(KeyStore(r).create("acme3", max_in_flight=2))
    first = keyed_api.post("/v1/requests", json={**BODY, "id": "a"}, headers=limited)
    second = keyed_api.post("/v1/requests", json={**BODY, "id": "b"}, headers=limited)
    assert first.status_code == second.status_code == 202
    refused = keyed_api.post("/v1/requests", json={**BODY, "id": "c"}, headers=limited)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "in_flight"
    assert not r.exists(ECHO.request("acme3@c"))  # refused before anything was queued
    assert answer(r, ECHO) == ["acme3@a", "acme3@b"]
    # the caller sees "a" finished: its place is given back
    assert keyed_api.get("/v1/requests/a?model=echo", headers=limited).json()["status"] == "ok"
    assert keyed_api.post("/v1/requests", json={**BODY, "id": "c"},
                          headers=limited).status_code == 202


def test_tokens_per_minute_refuses_what_would_overdraw_the_bucket(
        keyed_api: TestClient, r: redis.Redis) -> None:
    limited = Tenants.bearer(KeyStore(r).create("acme4", tokens_per_minute=100))
    big = {"input": "x" * 360, "model": "echo"}  # about 90 tokens at 4 bytes a token
    first = keyed_api.post("/v1/requests", json={"prompt": "x" * 360, "model": "echo"},
                           headers=limited)
    assert first.status_code == 202
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 10
    refused = keyed_api.post("/v1/embeddings", json=big, headers=limited)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "tokens"
    assert refused.headers["x-ratelimit-limit-tokens"] == "100"


def test_a_generation_that_stops_early_gives_back_what_it_did_not_use(
        keyed_api: TestClient, r: redis.Redis) -> None:
    limited = Tenants.bearer(KeyStore(r).create("acme5", tokens_per_minute=300))
    body = {"prompt": "hello world", "model": "echo", "task": "generate",
            "params": {"max_new_tokens": 200}}
    queued = keyed_api.post("/v1/requests", json={**body, "id": "g1"}, headers=limited)
    assert queued.status_code == 202
    assert int(queued.headers["x-ratelimit-remaining-tokens"]) < 100  # 200 + prompt reserved
    answer(r, QueueKeys.for_model("generate", "echo"))  # 2 prompt + 2 completion tokens
    done = keyed_api.get("/v1/requests/g1?model=echo&task=generate", headers=limited)
    assert done.json()["status"] == "ok"
    after = keyed_api.post("/v1/requests", json={**body, "id": "g2"}, headers=limited)
    assert after.status_code == 202  # would be a 429 had g1 kept its 203 tokens
    assert int(after.headers["x-ratelimit-remaining-tokens"]) >= 300 - 4 - 203 - 5


def test_usage_is_billed_once_per_request_and_shown_to_admins_only(
        keyed_api: TestClient, tenants: Tenants, r: redis.Redis) -> None:
    acme = Tenants.bearer(tenants.acme)
    for i in range(3):
        keyed_api.post("/v1/requests", json={"prompt": "one two three", "model": "echo",
                                             "task": "generate", "id": f"u{i}"}, headers=acme)
    answer(r, QueueKeys.for_model("generate", "echo"))  # 3 prompt + 2 completion tokens each
    assert keyed_api.get("/admin/usage", headers=acme).status_code == 403
    assert keyed_api.get("/metrics/usage", headers=acme).status_code == 403
    admin = Tenants.bearer(tenants.admin)
    (row,) = keyed_api.get("/admin/usage", headers=admin).json()["usage"]
    assert (row["tenant"], row["model"], row["requests"]) == ("acme", "echo", 3)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (9, 6)
    text = keyed_api.get("/metrics/usage", headers=admin).text
    assert 'inferq_tenant_requests_total{tenant="acme",task="generate",model="echo"} 3' in text


def test_a_requests_only_key_settles_nothing(keyed_api: TestClient, r: redis.Redis) -> None:
    """Nothing to give back: no settlement script runs, its reservations simply expire; a key
    with an in-flight limit has its reservations settled once its requests are read back
    (on the tenant's next admission, or on their own shortly after)."""
    names = TenancyKeys()
    for tenant, limits in (("rpm-only", {"requests_per_minute": 50}),
                           ("in-flight", {"max_in_flight": 50})):
        key = Tenants.bearer(KeyStore(r).create(tenant, **limits))  # type: ignore[arg-type]
        for i in range(3):
            assert keyed_api.post("/v1/requests", json={**BODY, "id": f"s{i}"},
                                  headers=key).status_code == 202
        assert r.hlen(names.queued_bytes(tenant)) == 3  # reserved
        answer(r, ECHO)
        for i in range(3):
            assert keyed_api.get(f"/v1/requests/s{i}?model=echo",
                                 headers=key).json()["status"] == "ok"
        if tenant == "rpm-only":
            assert r.hlen(names.queued_bytes(tenant)) == 3
        else:  # deferred (no next admission to carry them): on their own within 50 ms
            wait_until(lambda t=tenant: r.hlen(names.queued_bytes(t)) == 0, timeout=5,
                       what="the deferred settlements")


def test_concurrent_calls_on_two_gateways_share_one_exact_limit(
        redis_url: str, r: redis.Redis) -> None:
    """40 calls at once, split over two real gateway servers: exactly the key's limits are
    admitted, whatever the interleaving (each admission is one atomic script in Redis)."""
    import asyncio

    import httpx
    from pydantic import SecretStr

    from inferq.gateway import GatewaySettings
    from tests.support.gateway import serve

    flight = Tenants.bearer(KeyStore(r).create("burst", max_in_flight=5))
    rate = Tenants.bearer(KeyStore(r).create("rate", requests_per_minute=7))
    settings = GatewaySettings(redis_url=SecretStr(redis_url), require_served_model=False)

    async def burst(urls: list[str], key: dict[str, str]) -> list[int]:
        async with httpx.AsyncClient(timeout=30) as http:
            calls = [http.post(f"{urls[i % 2]}/requests", json={**BODY, "id": f"c{i}"},
                               headers=key) for i in range(40)]
            return [answer.status_code for answer in await asyncio.gather(*calls)]

    with serve(settings) as one, serve(settings) as two:
        for key, admitted in ((flight, 5), (rate, 7)):
            statuses = asyncio.run(burst([one, two], key))
            assert statuses.count(202) == admitted and statuses.count(429) == 40 - admitted


def test_a_settlement_rides_on_the_tenants_next_admission(keyed_api: TestClient,
                                                          r: redis.Redis) -> None:
    """One slot: the call after a finished one is admitted at once, its admission carrying
    the settlement of the one before (no round trip of its own, no waiting for it)."""
    one = Tenants.bearer(KeyStore(r).create("one-slot", max_in_flight=1))
    for i in range(5):
        made = keyed_api.post("/v1/requests?wait=false", json={**BODY, "id": f"n{i}"},
                              headers=one)
        assert made.status_code == 202, (i, made.text)
        assert keyed_api.post("/v1/requests", json={**BODY, "id": f"x{i}"},
                              headers=one).status_code == 429  # the slot is taken
        answer(r, ECHO)
        assert keyed_api.get(f"/v1/requests/n{i}?model=echo",
                             headers=one).json()["status"] == "ok"


def test_a_failed_request_gives_its_slot_back(keyed_api: TestClient, r: redis.Redis) -> None:
    """A call whose request fails (a worker error) settles like one that succeeded."""
    import threading

    one = Tenants.bearer(KeyStore(r).create("fails", max_in_flight=1))
    fail = threading.Thread(target=lambda: wait_until(
        lambda: bool(answer(r, ECHO, fail_on="boom")), timeout=10, what="the request"))
    fail.start()
    failed = keyed_api.post("/v1/requests?wait=true", json={"prompt": "boom", "model": "echo"},
                            headers=one)
    fail.join()
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "model_error"
    assert keyed_api.post("/v1/requests", json=BODY, headers=one).status_code == 202
