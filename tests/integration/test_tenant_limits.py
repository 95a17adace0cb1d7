"""Per-tenant limits (``inferq.tenancy.limits``) against a real Redis: token buckets for
requests and tokens, in flight, queued bytes, refusals that change nothing, idempotent
settles, and the rate-limit headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from inferq.protocol.keys import TenancyKeys
from inferq.tenancy import Principal
from inferq.tenancy.headers import duration, rate_limit_headers
from inferq.tenancy.limits import Admission, Limiter

TTL = 60.0
NAMES = TenancyKeys()


@pytest.fixture
async def limiter(redis_url: str) -> AsyncIterator[Limiter]:
    client = aioredis.Redis.from_url(redis_url)
    yield Limiter(client)
    await client.aclose()


def tenant(**limits: Any) -> Principal:
    return Principal(tenant="acme", scopes=frozenset({"api"}), key_id="key_1", **limits)


def snapshot(r: redis.Redis, name: str = "acme") -> dict[str, Any]:
    return {"bucket": r.hgetall(NAMES.limits(name)),
            "flight": r.zrange(NAMES.in_flight(name), 0, -1, withscores=True),
            "reserved": r.hgetall(NAMES.queued_bytes(name))}


async def test_no_limits_cost_no_redis_call(limiter: Limiter, r: redis.Redis) -> None:
    r.config_resetstat()
    for who in (tenant(), Principal.operator()):
        got = await limiter.admit(who, ["a"], 10_000, 1 << 20, TTL)
        assert got.admitted and rate_limit_headers(got) == {}
        assert await limiter.settle(who, [("a", 5)]) == 0
    assert r.info("stats")["total_commands_processed"] == 1  # the CONFIG RESETSTAT itself


async def test_requests_per_minute_refuses_the_next_and_changes_nothing(
        limiter: Limiter, r: redis.Redis) -> None:
    who = tenant(requests_per_minute=3)
    seen = [await limiter.admit(who, [f"r{i}"], 0, 0, TTL) for i in range(3)]
    assert [a.admitted for a in seen] == [True, True, True]
    assert [a.requests_remaining for a in seen] == [2, 1, 0]
    before = snapshot(r)
    refused = await limiter.admit(who, ["r3"], 0, 0, TTL)
    assert not refused.admitted and refused.limit == "requests"
    # 3 a minute: one more is 20 s away (minus what refilled since)
    assert 1 <= refused.retry_after_s <= 20 and refused.requests_reset_ms <= 20_000
    assert "requests per minute (3)" in refused.message
    # the refusal wrote nothing but the bucket's level is read with the clock: same fields
    assert snapshot(r)["flight"] == before["flight"]
    assert snapshot(r)["reserved"] == before["reserved"]
    assert snapshot(r)["bucket"] == before["bucket"]
    headers = rate_limit_headers(refused)
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["Retry-After"] == str(refused.retry_after_s)
    assert "x-ratelimit-limit-tokens" not in headers


async def test_a_repeated_id_is_not_charged_twice(limiter: Limiter) -> None:
    who = tenant(requests_per_minute=2, max_in_flight=1)
    assert (await limiter.admit(who, ["same"], 0, 0, TTL)).admitted
    again = await limiter.admit(who, ["same"], 0, 0, TTL)
    assert again.admitted and again.in_flight == 1 and again.requests_remaining == 1


async def test_tokens_reserve_then_settle_gives_back_once(limiter: Limiter,
                                                          r: redis.Redis) -> None:
    who = tenant(tokens_per_minute=1000)
    first = await limiter.admit(who, ["a"], 600, 0, TTL)
    assert first.admitted and first.tokens_remaining == 400
    refused = await limiter.admit(who, ["b"], 600, 0, TTL)
    assert not refused.admitted and refused.limit == "tokens"
    # 200 more tokens at 1000 per minute: 12 s, give or take what refilled meanwhile
    assert 11 <= refused.retry_after_s <= 12 and 11_000 < refused.tokens_reset_ms <= 12_000
    assert await limiter.settle(who, [("a", 100)]) == 1   # used 100 of 600: 500 back
    assert await limiter.settle(who, [("a", 100)]) == 0   # twice: nothing more
    level = float(r.hget(NAMES.limits("acme"), "tk") or 0)
    assert 900 <= level <= 1000
    assert (await limiter.admit(who, ["b"], 600, 0, TTL)).admitted


async def test_settle_never_fills_above_capacity_and_unknown_actual_keeps_the_reservation(
        limiter: Limiter, r: redis.Redis) -> None:
    who = tenant(tokens_per_minute=1000)
    assert (await limiter.admit(who, ["a", "b"], 400, 0, TTL)).admitted  # 200 each
    assert await limiter.settle(who, [("a", None)]) == 1
    assert float(r.hget(NAMES.limits("acme"), "tk") or 0) < 700
    assert await limiter.settle(who, [("b", 0)]) == 1
    assert float(r.hget(NAMES.limits("acme"), "tk") or 0) <= 1000
    assert r.hlen(NAMES.queued_bytes("acme")) == 0


async def test_a_request_larger_than_the_minute_is_refused_for_good(limiter: Limiter) -> None:
    got = await limiter.admit(tenant(tokens_per_minute=100), ["a"], 101, 0, TTL)
    assert not got.admitted and got.limit == "tokens" and got.retry_after_s == 60
    assert "request too large" in got.message


async def test_the_bucket_refills_continuously(limiter: Limiter) -> None:
    # 6,000,000 a minute is 100 tokens per ms: drained, it holds 500 again within a few ms
    who = tenant(tokens_per_minute=6_000_000)
    assert (await limiter.admit(who, ["drain"], 6_000_000, 0, TTL)).admitted
    refused = await limiter.admit(who, ["big"], 6_000_000, 0, TTL)
    assert not refused.admitted and refused.tokens_remaining < 6_000_000
    for attempt in range(1000):  # each try is one round trip: the clock moves on meanwhile
        got = await limiter.admit(who, [f"small{attempt}"], 500, 0, TTL)
        if got.admitted:
            break
    assert got.admitted


async def test_max_in_flight_counts_until_settled(limiter: Limiter) -> None:
    who = tenant(max_in_flight=2)
    assert (await limiter.admit(who, ["a", "b"], 0, 0, TTL)).admitted
    refused = await limiter.admit(who, ["c"], 0, 0, TTL)
    assert not refused.admitted and refused.limit == "in_flight" and refused.retry_after_s == 1
    assert rate_limit_headers(refused) == {"Retry-After": "1"}
    await limiter.settle(who, [("a", 3)])
    assert (await limiter.admit(who, ["c"], 0, 0, TTL)).admitted


async def test_a_lost_request_stops_counting_after_its_deadline(limiter: Limiter,
                                                                r: redis.Redis) -> None:
    who = tenant(max_in_flight=1, max_queued_bytes=100)
    assert (await limiter.admit(who, ["lost"], 0, 80, TTL)).admitted
    assert not (await limiter.admit(who, ["next"], 0, 10, TTL)).admitted
    # its deadline passes (moved into the past, not waited for)
    r.zadd(NAMES.in_flight("acme"), {"lost": 1})
    got = await limiter.admit(who, ["next"], 0, 90, TTL)
    assert got.admitted and got.in_flight == 1 and got.queued_bytes == 90
    assert r.hkeys(NAMES.queued_bytes("acme")) == [b"next"]
    assert await limiter.settle(who, [("lost", 0)]) == 0  # its late settle does nothing


async def test_queued_bytes_budget(limiter: Limiter) -> None:
    who = tenant(max_queued_bytes=1000)
    assert (await limiter.admit(who, ["a"], 0, 700, TTL)).admitted
    refused = await limiter.admit(who, ["b"], 0, 400, TTL)
    assert not refused.admitted and refused.limit == "queued_bytes"
    assert refused.queued_bytes == 700 and "queued bytes (1000" in refused.message
    await limiter.settle(who, [("a", None)])
    assert (await limiter.admit(who, ["b"], 0, 400, TTL)).admitted


async def test_tenants_do_not_share_buckets(limiter: Limiter) -> None:
    a = tenant(requests_per_minute=1)
    b = Principal(tenant="other", scopes=frozenset({"api"}), requests_per_minute=1)
    assert (await limiter.admit(a, ["x"], 0, 0, TTL)).admitted
    assert (await limiter.admit(b, ["x"], 0, 0, TTL)).admitted
    assert not (await limiter.admit(a, ["y"], 0, 0, TTL)).admitted


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"), (20, "20ms"), (999, "999ms"), (1000, "1s"), (1500, "1.5s"), (8640, "8.64s"),
    (60_000, "1m0s"), (360_000, "6m0s"), (61_250, "1m1.25s"), (3_600_000, "1h0m0s")])
def test_reset_durations_as_openai_writes_them(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_headers_only_for_the_limits_a_key_has() -> None:
    both = Admission(admitted=True, requests_limit=10, requests_remaining=9,
                     requests_reset_ms=6000, tokens_limit=1000, tokens_remaining=400,
                     tokens_reset_ms=36_000)
    assert rate_limit_headers(both) == {
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "6s", "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "36s"}


async def test_concurrent_admissions_never_overshoot(limiter: Limiter) -> None:
    who = tenant(requests_per_minute=10, max_in_flight=50)
    got = await asyncio.gather(*(limiter.admit(who, [f"c{i}"], 0, 0, TTL) for i in range(40)))
    assert sum(a.admitted for a in got) == 10
    assert {a.limit for a in got if not a.admitted} == {"requests"}


async def test_one_loop_turns_calls_of_many_tenants_are_one_script_command(
        limiter: Limiter, r: redis.Redis) -> None:
    a = tenant(requests_per_minute=2, tokens_per_minute=1000)
    b = Principal(tenant="other", scopes=frozenset({"api"}), requests_per_minute=1)
    assert (await limiter.admit(a, ["warm"], 10, 0, TTL)).admitted  # loads the script
    r.config_resetstat()
    before = limiter.batcher.round_trips
    got = await asyncio.gather(limiter.admit(a, ["x"], 100, 0, TTL),
                               limiter.admit(b, ["x"], 0, 0, TTL),
                               limiter.admit(a, ["y"], 100, 0, TTL),  # a's third: refused
                               limiter.settle(a, [("warm", 4)]),
                               limiter.admit(b, ["y"], 0, 0, TTL))  # b's second: refused
    assert limiter.batcher.round_trips == before + 1
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] == 1
    # in order, each seeing the state the ones before it left
    assert [g.admitted for g in (got[0], got[1], got[2], got[4])] == [True, True, False, False]
    assert got[0].tokens_remaining == 1000 - 10 - 100 and got[3] == 1
    assert r.hget(NAMES.queued_bytes("acme"), "x") == b"100 0"
    assert r.zrange(NAMES.in_flight("other"), 0, -1) == [b"x"]


async def test_a_malformed_call_fails_the_whole_command_with_nothing_written(
        limiter: Limiter, r: redis.Redis) -> None:
    from inferq.protocol.ops import packed

    keys = limiter.keys("acme")
    good = ["admit", 1, [5, 0, 0, 0, 60_000, 0, "g", 0, 0]]
    for bad in (["admit", 4, [5, 0, 0, 0, 60_000, 0]],  # keys beyond those given
                ["x", 1, []], ["settle", 1, "not a table"]):
        with pytest.raises(redis.exceptions.ResponseError, match="bad arguments"):
            await limiter.batcher.script(keys=keys, args=[packed([good, bad])])
    with pytest.raises(redis.exceptions.ResponseError, match="bad arguments"):
        await limiter.batcher.script(keys=keys, args=[b"\xc1 not msgpack"])
    assert snapshot(r) == {"bucket": {}, "flight": [], "reserved": {}}
