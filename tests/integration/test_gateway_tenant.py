"""The gateway's tenant: from OpenAI's ``user`` field or the ``X-Inferq-Tenant`` header, as
the operator configures (``INFERQ_GATEWAY_TENANT_FROM``), or not at all. Seen through a
tenant quota of one request that is already used: a call in that tenant's name is refused at
once (429), any other waits (here: 504 after a short timeout, no worker runs)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import redis
from fastapi.testclient import TestClient

import inferq
from inferq.protocol.settings import SET_TENANTS, tenants_call
from tests.support.gateway import ECHO

MakeApi = Callable[..., AbstractContextManager[TestClient]]
SHORT = {"X-Timeout-S": "0.3"}


def fill_quota(redis_url: str, r: redis.Redis, task: str = "embed") -> None:
    config = ECHO.config if task == "embed" else f"inferq:{{{task}:echo}}:config"
    keys, args = tenants_call(config, max_depths={"team-a": 1})
    r.register_script(SET_TENANTS)(keys=keys, args=args)
    with inferq.Client(redis_url, options=inferq.ClientOptions(warn_no_worker=False)) as c:
        c.enqueue("first", model="echo", task=task, tenant="team-a")


def embed(api: TestClient, headers: dict[str, str] | None = None, **body: Any) -> int:
    response = api.post("/v1/embeddings", json={"input": "x", "model": "echo", **body},
                        headers={**SHORT, **(headers or {})})
    return response.status_code


def test_tenant_from_the_user_field(make_api: MakeApi, redis_url: str, r: redis.Redis) -> None:
    fill_quota(redis_url, r)
    with make_api(tenant_from="user") as api:
        assert embed(api, user="team-a") == 429
        assert embed(api, user="team-b") == 504
        assert embed(api, {"X-Inferq-Tenant": "team-a"}) == 504  # the header is not trusted
        bad = api.post("/v1/embeddings", json={"input": "x", "model": "echo", "user": "a b"})
        assert bad.status_code == 422 and "tenant" in bad.json()["error"]["message"], bad.text
        native = api.post("/v1/requests", json={"prompt": "x", "model": "echo",
                                                "tenant": "team-a"})
        assert native.status_code == 429


def test_tenant_from_the_header(make_api: MakeApi, redis_url: str, r: redis.Redis) -> None:
    fill_quota(redis_url, r)
    with make_api(tenant_from="header") as api:
        assert embed(api, {"X-Inferq-Tenant": "team-a"}) == 429
        assert embed(api, user="team-a") == 504  # the user field is not trusted
        native = api.post("/v1/requests", json={"prompt": "x", "model": "echo"},
                          headers={"X-Inferq-Tenant": "team-a"})
        assert native.status_code == 429


def test_no_tenant_unless_configured(make_api: MakeApi, redis_url: str, r: redis.Redis) -> None:
    fill_quota(redis_url, r)
    with make_api() as api:
        assert embed(api, {"X-Inferq-Tenant": "team-a"}, user="team-a") == 504


def test_chat_completions_take_the_tenant_too(make_api: MakeApi, redis_url: str,
                                              r: redis.Redis) -> None:
    fill_quota(redis_url, r, task="generate")
    with make_api(tenant_from="user") as api:
        chat = api.post("/v1/chat/completions", headers=SHORT, json={
            "model": "echo", "user": "team-a", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 429
        assert "team-a" in chat.json()["error"]["message"]
