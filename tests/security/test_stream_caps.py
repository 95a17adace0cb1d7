"""Open streams cannot starve the gateway: with 400 resume streams open (a request that stays
queued, no worker), a plain ``GET /v1/requests/{id}`` still answers at once, stream 401 is
refused with 429 and ``Retry-After``, and closing streams gives their places back."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis
from pydantic import SecretStr

import inferq
from inferq.gateway import GatewaySettings
from inferq.gateway.streams import StreamSlots
from inferq.openai.errors import ApiError
from inferq.producer.options import ClientOptions
from inferq.protocol.fields import StreamField
from inferq.protocol.keys import QueueKeys
from tests.support.gateway import CHAT, TOKEN, auth, serve
from tests.support.generation import MODEL

pytestmark = pytest.mark.timeout(120)

STREAMS = 400


@pytest.fixture
def capped(redis_url: str) -> Iterator[str]:
    settings = GatewaySettings(redis_url=SecretStr(redis_url), token=SecretStr(TOKEN),
                               timeout_s=120, require_served_model=False,
                               max_streams=STREAMS, max_streams_per_tenant=STREAMS)
    with serve(settings) as url:
        yield url.removesuffix("/v1")


@contextlib.asynccontextmanager
async def open_streams(http: httpx.AsyncClient, path: str, n: int
                       ) -> AsyncIterator[list[httpx.Response]]:
    """``n`` streams whose response headers arrived (the gateway holds them open), closed on
    exit."""
    responses: list[httpx.Response] = []
    try:
        async def one() -> None:
            response = await http.send(http.build_request("GET", path, headers=auth()),
                                       stream=True)
            responses.append(response)
        await asyncio.gather(*(one() for _ in range(n)))
        yield responses
    finally:
        await asyncio.gather(*(r.aclose() for r in responses), return_exceptions=True)


async def timed_get(http: httpx.AsyncClient, path: str) -> float:
    start = time.perf_counter()
    response = await http.get(path, headers=auth())
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "pending"
    return elapsed


async def test_400_open_streams_leave_the_gateway_responsive_and_stream_401_gets_429(
        capped: str, redis_url: str) -> None:
    with inferq.Client(redis_url, options=ClientOptions(warn_no_worker=False)) as client:
        client.enqueue("the queue", model=MODEL, task="generate", id="held-open")
    stream = f"/v1/requests/held-open/stream?model={MODEL}"
    status = f"/v1/requests/held-open?model={MODEL}&task=generate"
    limits = httpx.Limits(max_connections=STREAMS + 16, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=capped, timeout=30, limits=limits) as streams, \
            httpx.AsyncClient(base_url=capped, timeout=30) as http:
        await timed_get(http, status)  # warm: the first call opens connections
        async with open_streams(streams, stream, STREAMS) as opened:
            assert [r.status_code for r in opened] == [200] * STREAMS
            took = [await timed_get(http, status) for _ in range(15)]
            p50 = statistics.median(took)
            print(f"GET with {STREAMS} streams open: p50 {p50 * 1e3:.1f} ms, "
                  f"max {max(took) * 1e3:.1f} ms")
            assert p50 < 0.05, took
            # Over the cap: the resume route and a new streamed completion are refused
            # before anything is queued or sent.
            over = await http.get(stream, headers=auth())
            assert over.status_code == 429, over.text
            assert over.json()["error"]["code"] == "too_many_streams"
            assert int(over.headers["Retry-After"]) >= 1
            post = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": CHAT, "stream": True},
                headers={**auth(), "X-Request-Id": "never-queued"})
            assert post.status_code == 429, post.text
            gone = await http.get(f"/v1/requests/never-queued?model={MODEL}&task=generate",
                                  headers=auth())
            assert gone.status_code == 404
        # Closed streams give their places back (the gateway sees each disconnect).
        deadline = time.monotonic() + 20
        while True:
            async with open_streams(streams, stream, 1) as again:
                if again[0].status_code == 200:
                    break
            assert time.monotonic() < deadline, "closed streams kept their places"
            await asyncio.sleep(0.05)


def test_caps_per_tenant_and_per_gateway() -> None:
    slots = StreamSlots(max_streams=5, max_per_tenant=2, retry_after_s=3)
    a1, _a2 = slots.take("a"), slots.take("a")
    with pytest.raises(ApiError) as refused:
        slots.take("a")
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "3"
    assert "your 2" in refused.value.message
    op1, _op2 = slots.take(None), slots.take(None)  # callers without a tenant: one bucket
    with pytest.raises(ApiError):
        slots.take(None)
    slots.take("b")
    with pytest.raises(ApiError) as full:  # 5 open: the gateway's cap, whoever asks
        slots.take("c")
    assert "this gateway's 5" in full.value.message
    a1.release()
    a1.release()  # idempotent
    slots.take("c")
    op1.release()
    assert slots.open == 4 and slots.by_tenant == {"a": 1, None: 1, "b": 1, "c": 1}


async def first_event_after(http: httpx.AsyncClient, r: redis.Redis, request_id: str) -> float:
    """Seconds from the worker's first delta to its event at the client, on a stream opened
    while the gateway's reader is blocked on the others."""
    async with http.stream("GET", f"/v1/requests/{request_id}/stream?model={MODEL}",
                           headers=auth()) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        start = time.perf_counter()
        r.xadd(QueueKeys.for_model("generate", MODEL).stream(request_id),
               {StreamField.ATTEMPT: 1, StreamField.TEXT: "first"})
        async for line in lines:
            if "first" in line:
                return time.perf_counter() - start
    raise AssertionError("the stream ended without its delta")


async def test_a_stream_opened_while_the_reader_blocks_does_not_wait_out_the_block(
        capped: str, redis_url: str, r: redis.Redis) -> None:
    """The reader's ``XREAD BLOCK`` (up to 250 ms) is woken for a new stream: its first
    token is not late (a stream would otherwise wait 125 ms on average)."""
    ids = ["held-open", *(f"newcomer-{i}" for i in range(7))]
    with inferq.Client(redis_url, options=ClientOptions(warn_no_worker=False)) as client:
        for request_id in ids:
            client.enqueue("the queue", model=MODEL, task="generate", id=request_id)
    async with httpx.AsyncClient(base_url=capped, timeout=30) as http, \
            open_streams(http, f"/v1/requests/held-open/stream?model={MODEL}", 1):
        took = [await first_event_after(http, r, i) for i in ids[1:]]
    print(f"first event of a new stream: p50 {statistics.median(took) * 1e3:.1f} ms")
    assert statistics.median(took) < 0.06, took
