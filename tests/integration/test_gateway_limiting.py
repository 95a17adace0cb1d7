"""The gateway's glue for the per-tenant limits (``inferq.gateway.limiting``): a refusal is
a 429 ``ApiError`` with ``Retry-After`` and the ``x-ratelimit-*`` headers, a success returns
the headers, and results settle on their actual tokens, once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI, Response

from inferq.gateway import errors
from inferq.gateway.limiting import (
    actual_tokens,
    admit_call,
    estimate_tokens,
    release,
    settle_results,
    ttl_for,
)
from inferq.openai.errors import ApiError
from inferq.protocol.codec import Result, Status, Usage
from inferq.tenancy import Principal

KEY = Principal(tenant="acme", scopes=frozenset({"api"}), requests_per_minute=100,
                tokens_per_minute=1000, max_in_flight=2)


@pytest.fixture
async def aio(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def generated(request_id: str, prompt: int, completion: int) -> Result:
    return Result(id=request_id, status=Status.OK, output={"text": "x"},
                  usage=Usage(prompt_tokens=prompt, completion_tokens=completion))


async def test_success_headers_then_a_429_naming_the_limit(aio: aioredis.Redis) -> None:
    headers = await admit_call(aio, KEY, ["acme@1"], estimate=700, payload_bytes=10,
                               ttl_s=ttl_for(30))
    assert headers["x-ratelimit-limit-requests"] == "100"
    assert headers["x-ratelimit-remaining-requests"] == "99"
    assert headers["x-ratelimit-remaining-tokens"] == "300"
    assert "Retry-After" not in headers
    with pytest.raises(ApiError) as refused:
        await admit_call(aio, KEY, ["acme@2"], estimate=700, payload_bytes=10, ttl_s=30)
    err = refused.value
    assert (err.status, err.type, err.code) == (429, "rate_limit_error", "tokens")
    assert "tokens per minute (1000)" in err.message
    assert int(err.headers["Retry-After"]) >= 1
    assert err.headers["x-ratelimit-limit-tokens"] == "1000"
    assert err.headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_settle_on_usage_gives_back_the_unused_estimate_once(
        aio: aioredis.Redis) -> None:
    await admit_call(aio, KEY, ["acme@g"], estimate=900, payload_bytes=0, ttl_s=30)
    result = generated("acme@g", 10, 40)  # stopped early: 50 of 900
    assert await settle_results(aio, KEY, [result]) == 1
    assert await settle_results(aio, KEY, [result]) == 0
    headers = await admit_call(aio, KEY, ["acme@h"], estimate=900, payload_bytes=0, ttl_s=30)
    assert int(headers["x-ratelimit-remaining-tokens"]) >= 50


async def test_release_frees_the_in_flight_slots(aio: aioredis.Redis) -> None:
    await admit_call(aio, KEY, ["acme@a", "acme@b"], estimate=2, payload_bytes=0, ttl_s=30)
    with pytest.raises(ApiError) as refused:
        await admit_call(aio, KEY, ["acme@c"], estimate=1, payload_bytes=0, ttl_s=30)
    assert refused.value.code == "in_flight"
    assert await release(aio, KEY, ["acme@a"]) == 1
    await admit_call(aio, KEY, ["acme@c"], estimate=1, payload_bytes=0, ttl_s=30)


async def test_a_key_without_limits_gets_no_headers(aio: aioredis.Redis) -> None:
    free = Principal(tenant="acme", scopes=frozenset({"api"}))
    assert await admit_call(aio, free, ["x"], estimate=10**9, payload_bytes=0, ttl_s=1) == {}
    assert await settle_results(aio, free, [generated("x", 1, 1)]) == 0


def test_actual_tokens_per_kind_of_result() -> None:
    assert actual_tokens(generated("a", 3, 4)) == 7
    embedded = Result(id="e", status=Status.OK, output=[0.1], input_tokens=12)
    assert actual_tokens(embedded) == 12
    assert actual_tokens(Result(id="o", status=Status.OK, output="echo")) is None
    assert actual_tokens(Result(id="f", status=Status.FAILED)) == 0
    assert estimate_tokens(10, max_tokens=16, n=2) == 3 + 32
    assert estimate_tokens(0) == 1


async def test_the_429_over_http_carries_the_headers(aio: aioredis.Redis) -> None:
    key = Principal(tenant="acme", scopes=frozenset({"api"}), requests_per_minute=1)
    app = FastAPI()
    errors.install(app, 1)

    @app.post("/call/{request_id}")
    async def call(request_id: str, response: Response) -> dict[str, str]:
        response.headers.update(await admit_call(
            aio, key, [key.stored_id(request_id)], estimate=1, payload_bytes=0, ttl_s=30))
        return {"id": request_id}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        ok = await http.post("/call/a")
        refused = await http.post("/call/b")
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "requests"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "1"
