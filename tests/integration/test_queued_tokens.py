"""``inferq queue set --max-queued-tokens``: a bound on the estimated tokens pending per
priority band, decided in the enqueue script (``QueuedTokensFull``, 429 at the gateway), and
the per-band count every script that moves a request into or out of pending keeps."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

import inferq
from inferq.cli.main import main
from inferq.protocol import ops
from inferq.protocol.keys import QUEUED_TOKENS, QueueKeys
from inferq.protocol.settings import SET_SETTINGS, settings_call
from tests.support.gateway import ECHO

KEYS = QueueKeys.for_model("embed", "qt")
NO_CACHE = inferq.ClientOptions(settings_ttl_s=0, warn_no_worker=False)
PROMPT = "x" * 160  # 40 estimated tokens (4 bytes a token)


@pytest.fixture
def sc(redis_url: str) -> Iterator[inferq.Client]:
    with inferq.Client(redis_url, options=NO_CACHE) as c:
        yield c


def bound(r: redis.Redis, tokens: int, keys: QueueKeys = KEYS) -> None:
    call_keys, args = settings_call(keys.config, None, "keep", max_queued_tokens=tokens)
    r.register_script(SET_SETTINGS)(keys=call_keys, args=args)


def queued(r: redis.Redis, priority: int = 0, keys: QueueKeys = KEYS) -> int:
    raw = r.hget(keys.stats, f"{QUEUED_TOKENS}{100 - priority}")
    return int(raw) if raw is not None else 0


def claim(r: redis.Redis, n: int, keys: QueueKeys = KEYS,
          lease_ms: int = 60_000) -> list[ops.Claimed]:
    call_keys, args = ops.claim_call(keys, "w", lease_ms, n, 60_000)
    return ops.parse_claim(ops.register(r)["claim"](keys=call_keys, args=args)).claimed


def test_a_band_is_refused_past_its_bound_and_counts_down(sc: inferq.Client,
                                                          r: redis.Redis) -> None:
    bound(r, 100)
    sc.enqueue(PROMPT, model="qt", id="a")
    sc.enqueue(PROMPT, model="qt", id="b")
    assert queued(r) == 80
    with pytest.raises(inferq.QueuedTokensFull) as refused:
        sc.enqueue(PROMPT, model="qt", id="c")
    assert (refused.value.tokens, refused.value.max_queued_tokens) == (40, 100)
    assert refused.value.code == "queued_tokens_full" and refused.value.retry_after_s > 0
    assert isinstance(refused.value, inferq.QueueFull)
    assert r.zcard(KEYS.pending) == 2 and not r.exists(KEYS.request("c"))
    sc.enqueue("y" * 80, model="qt", id="small")  # 20 more: exactly the bound
    assert queued(r) == 100
    sc.enqueue(PROMPT, model="qt", id="urgent", priority=5)  # a band of its own
    assert (queued(r), queued(r, 5)) == (100, 40)
    # claimed: no longer waiting, so the band has room again
    assert [c.id for c in claim(r, 2)] == ["urgent", "a"]
    assert (queued(r), queued(r, 5)) == (60, 0)
    assert r.hget(KEYS.stats, f"{QUEUED_TOKENS}95") is None  # deleted at 0
    sc.enqueue(PROMPT, model="qt", id="c")
    assert queued(r) == 100
    sc.handle("b", model="qt").cancel()
    assert queued(r) == 60


def test_claimed_requests_that_go_back_to_pending_count_again(sc: inferq.Client,
                                                               r: redis.Redis) -> None:
    bound(r, 1000)
    sc.enqueue_many([PROMPT] * 3, model="qt")
    taken = claim(r, 2)
    assert queued(r) == 40
    call_keys, args = ops.release_call(KEYS, [(c.id, c.token) for c in taken[:1]])
    assert ops.register(r)["release"](keys=call_keys, args=args) == 1
    assert queued(r) == 80
    # a lease that expires: reclaim puts the request back
    r.zadd(KEYS.inflight, {taken[1].id: 1})
    call_keys, args = ops.reclaim_call(KEYS, 100, 60_000, 100)
    assert ops.parse_reclaim(ops.register(r)["reclaim"](keys=call_keys, args=args)).requeued == 1
    assert queued(r) == 120
    assert len(claim(r, 10)) == 3 and queued(r) == 0


def test_requests_queued_without_a_bound_are_not_counted(sc: inferq.Client,
                                                          r: redis.Redis) -> None:
    sc.enqueue(PROMPT, model="qt", id="before")
    bound(r, 50)
    sc.enqueue(PROMPT, model="qt", id="after")
    assert queued(r) == 40
    claim(r, 10)
    assert queued(r) == 0
    bound(r, 0)  # removed
    sc.enqueue_many([PROMPT] * 3, model="qt")
    assert queued(r) == 0


def test_enqueue_many_refuses_what_passes_and_atomic_refuses_all(sc: inferq.Client,
                                                                 r: redis.Redis) -> None:
    bound(r, 100)
    with pytest.raises(inferq.QueuedTokensFull) as refused:
        sc.enqueue_many([PROMPT, "y" * 400, PROMPT, PROMPT], model="qt")
    assert refused.value.refused == [1, 3]  # 100 tokens alone; then 40 + 40 + 40 > 100
    assert len(refused.value.accepted) == 2 and refused.value.tokens == 100
    assert queued(r) == 80
    with pytest.raises(inferq.QueueFull):
        sc.enqueue_many(["z" * 40, PROMPT], model="qt", atomic=True)  # 10 fit, 40 do not
    assert queued(r) == 80 and r.zcard(KEYS.pending) == 2


def test_concurrent_enqueues_never_pass_the_bound(redis_url: str, r: redis.Redis) -> None:
    bound(r, 400)  # 40 requests of 10 tokens
    accepted: list[int] = []
    start = threading.Barrier(8)

    def producer() -> None:
        with inferq.Client(redis_url, options=NO_CACHE) as client:
            start.wait()
            mine = 0
            for _ in range(30):
                try:
                    client.enqueue("w" * 40, model="qt")
                    mine += 1
                except inferq.QueuedTokensFull:
                    pass
            accepted.append(mine)

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(accepted) == 40 == r.zcard(KEYS.pending)
    assert queued(r) == 400


def test_the_gateway_answers_429_with_retry_after(api: TestClient, r: redis.Redis) -> None:
    bound(r, 10, ECHO)  # set before the gateway first reads (and caches) the settings
    ok = api.post("/v1/requests", json={"prompt": "a" * 40, "model": "echo"})
    assert ok.status_code == 202, ok.text
    refused = api.post("/v1/requests", json={"prompt": "b", "model": "echo"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queued_tokens_full"
    assert int(refused.headers["Retry-After"]) >= 1
    embeddings = api.post("/v1/embeddings", json={"input": ["c", "d"], "model": "echo"})
    assert embeddings.status_code == 429
    assert embeddings.json()["error"]["code"] == "queued_tokens_full"
    assert r.zcard(ECHO.pending) == 1


def test_the_cli_sets_and_shows_the_bound(redis_url: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "set", "embed:qt", "--max-queued-tokens", "4096",
                 "--redis-url", redis_url]) == 0
    assert "max queued tokens 4096 per band" in capsys.readouterr().out
    assert main(["queue", "show", "embed:qt", "--json", "--redis-url", redis_url]) == 0
    assert json.loads(capsys.readouterr().out)["max_queued_tokens"] == 4096
    assert main(["queue", "set", "embed:qt", "--max-queued-tokens", "0",
                 "--redis-url", redis_url]) == 0
    assert "max queued tokens unbounded" in capsys.readouterr().out
    assert main(["queue", "set", "embed:qt", "--max-queued-tokens", "-1",
                 "--redis-url", redis_url]) != 0
    assert "max_queued_tokens must be an integer >= 0, got -1" in capsys.readouterr().err


async def test_an_async_client_reads_expired_settings_in_the_background(
        redis_url: str, r: redis.Redis) -> None:
    now = [0.0]
    options = inferq.ClientOptions(settings_ttl_s=1.0, warn_no_worker=False)
    async with inferq.AsyncClient(redis_url, options=options) as client:
        client._settings.clock = lambda: now[0]
        await client.enqueue("a", model="qt")  # never read: read first
        bound(r, 1)  # from now on every request is refused...
        now[0] = 1.5  # ...once read: expired, but younger than twice the TTL
        await client.enqueue(PROMPT, model="qt")  # the last settings (no bound); a read starts
        assert len(client._refreshing) == 1
        await asyncio.gather(*client._refreshing.values())
        with pytest.raises(inferq.QueuedTokensFull):
            await client.enqueue(PROMPT, model="qt")
        bound(r, 0)
        now[0] = 10.0  # older than twice the TTL: read first
        await client.enqueue("d", model="qt")
        assert not client._refreshing
    assert r.zcard(KEYS.pending) == 3
