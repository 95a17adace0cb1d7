"""Bad data written straight into a queue's keys (a buggy or hostile producer with Redis
access): each damaged request reaches a terminal state readable through the API, or, when
nothing ties the key to a request, is dropped and counted as garbage. The valid requests around
it are served, the worker keeps running, and no request hash is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import pytest
import redis

import inferq
from inferq.protocol import ops
from inferq.protocol.codec import Status
from inferq.stats import read_queue
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import KEYS, config, run_worker, stop

BAD = "bad"
REQ = KEYS.request(BAD)

Damage = Callable[[redis.Redis], None]


@dataclass(frozen=True)
class Case:
    damage: Damage
    #: The bad request's final (status, error code), or None: no request to answer (garbage).
    outcome: tuple[str, str | None] | None
    #: Garbage keys the scripts must count.
    garbage: int = 0
    #: Damage done after a (dead) worker claimed it, so the reclaim path meets it.
    inflight: bool = False
    #: The bad request started running on that dead worker before it died.
    started: bool = False


def hset(**fields: str | bytes) -> Damage:
    return lambda r: r.hset(REQ, mapping=fields)  # type: ignore[arg-type]


def hdel(*names: str) -> Damage:
    return lambda r: r.hdel(REQ, *names)


def replace_key(kind: str) -> Damage:
    def damage(r: redis.Redis) -> None:
        r.delete(REQ)
        if kind == "string":
            r.set(REQ, "junk")
        elif kind == "list":
            r.rpush(REQ, "junk")
        else:
            r.sadd(REQ, "junk")
    return damage


def payload_of(**fields: object) -> Damage:
    base = {"v": 1, "id": BAD, "task": "embed", "model": "t", "prompt": "x"}
    return hset(p=msgpack.packb({**base, **fields}))


def ghost_in(key: str, *, hash_fields: dict[str, str] | None = None) -> Damage:
    def damage(r: redis.Redis) -> None:
        r.zadd(key, {"ghost": 0 if key != KEYS.pending else 1})
        if hash_fields:
            r.hset(KEYS.request("ghost"), mapping=hash_fields)
    return damage


def result_key_is_a_string(r: redis.Redis) -> None:
    r.set(KEYS.result(BAD), "junk")


def inbox_key_is_a_string(r: redis.Redis) -> None:
    r.hset(REQ, "rt", "c1")
    r.set(KEYS.inbox("c1"), "junk")


CORRUPT = ("failed", "corrupt_request")
CASES: dict[str, Case] = {
    # claim path: damaged fields of a pending request
    "enqueue time missing": Case(hdel("eq"), CORRUPT),
    "enqueue time a float": Case(hset(eq="1700000000000.5"), CORRUPT),
    "enqueue time not a number": Case(hset(eq="yesterday"), CORRUPT),
    "enqueue time huge": Case(hset(eq="1e300"), CORRUPT),
    "deadline a float": Case(hset(dl="1700000000000.25"), CORRUPT),
    "deadline not a number": Case(hset(dl="soon"), CORRUPT),
    "deadline already passed": Case(hset(dl="1"), ("expired", "deadline_exceeded")),
    "attempts not a number": Case(hset(a="many"), CORRUPT),
    "attempts negative": Case(hset(a="-1"), CORRUPT),
    "attempts missing": Case(hdel("a"), CORRUPT),
    "attempts nan": Case(hset(a="nan"), CORRUPT),
    "attempts already used up": Case(hset(a="3", ma="3"), CORRUPT),
    "max attempts missing": Case(hdel("ma"), CORRUPT),
    "max attempts zero": Case(hset(ma="0"), CORRUPT),
    "batch cap zero": Case(hset(bc="0"), CORRUPT),
    "batch cap not a number": Case(hset(bc="half"), CORRUPT),
    "lost runs negative": Case(hset(l="-1"), CORRUPT),
    "score not a number": Case(hset(s="first"), CORRUPT),
    "score beyond 2^53": Case(hset(s="1e30"), CORRUPT),
    "payload missing": Case(hdel("p"), CORRUPT),
    "request key is a string": Case(replace_key("string"), CORRUPT),
    "request key is a list": Case(replace_key("list"), CORRUPT),
    "request key is a set": Case(replace_key("set"), CORRUPT),
    # worker path: the fields check out, the payload does not
    "payload not msgpack": Case(hset(p=b"\xc1\xc1 not msgpack"), ("failed", "invalid_request")),
    "payload empty": Case(hset(p=b""), ("failed", "invalid_request")),
    "payload a msgpack list": Case(hset(p=msgpack.packb([1, 2])),
                                   ("failed", "invalid_request")),
    "payload with a bad prompt type": Case(payload_of(prompt=7), ("failed", "invalid_request")),
    "payload of another request": Case(payload_of(id="other"), ("failed", "invalid_input")),
    "payload for another queue": Case(payload_of(model="elsewhere"),
                                      ("failed", "invalid_input")),
    "payload with a huge integer": Case(payload_of(priority=2**63), ("failed", "invalid_request")),
    # harmless damage: served normally
    "unknown state": Case(hset(st="bogus"), ("ok", None)),
    "result key holds a string": Case(result_key_is_a_string, ("ok", None)),
    "reply inbox holds a string": Case(inbox_key_is_a_string, ("ok", None)),
    # garbage: nothing ties these to a request
    "pending member without a hash": Case(ghost_in(KEYS.pending), None, garbage=1),
    "pending member whose hash has neither payload nor enqueue time": Case(
        ghost_in(KEYS.pending, hash_fields={"st": "pending", "a": "0"}), None, garbage=1),
    "inflight member without a hash": Case(ghost_in(KEYS.inflight), None, garbage=1),
    "delayed member without a hash": Case(ghost_in(KEYS.delayed), None, garbage=1),
    # reclaim path: an expired lease of a dead worker, damaged
    "expired lease, max attempts not a number": Case(hset(ma="x"), CORRUPT, inflight=True),
    "expired lease, score not a number": Case(hset(s="x"), CORRUPT, inflight=True),
    "expired lease, enqueue time a float": Case(hset(eq="12.5"), CORRUPT, inflight=True),
    "expired lease, key became a string": Case(replace_key("string"), CORRUPT, inflight=True),
    # a run lost with its worker is not an attempt: the last one allowed is not used up
    "expired lease, started, last attempt": Case(hset(ma="1"), ("ok", None),
                                                 inflight=True, started=True),
    # lost alone (a crash) for the last time allowed (max_crashes 2)
    "expired lease, started, last crash": Case(hset(x="1"), ("dead", "crashed_worker"),
                                               inflight=True, started=True),
    "expired lease, started, crashes not a number": Case(hset(x="many"), CORRUPT,
                                                         inflight=True, started=True),
    "expired lease, started, float enqueue time": Case(hset(eq="1.5"), CORRUPT, inflight=True,
                                                       started=True),
}


def claim_as_dead_worker(r: redis.Redis, *, start: bool) -> None:
    scripts = ops.register(r)
    keys, args = ops.claim_call(KEYS, "dead-worker", 60_000, 100, 60_000)
    claimed = ops.parse_claim(scripts["claim"](keys=keys, args=args)).claimed
    bad = [c for c in claimed if c.id == BAD]
    if start:
        keys, args = ops.start_call(KEYS, [(c.id, c.token) for c in bad])
        assert scripts["start"](keys=keys, args=args) == []
    keys, args = ops.release_call(KEYS, [(c.id, c.token) for c in claimed if c.id != BAD])
    scripts["release"](keys=keys, args=args)
    r.zadd(KEYS.inflight, {BAD: 0})  # its lease expired long ago


@pytest.mark.parametrize("name", list(CASES))
async def test_a_damaged_request_fails_alone(name: str, redis_url: str, r: redis.Redis,
                                             client: inferq.Client,
                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR", logger="inferq.worker")
    case = CASES[name]
    neighbours = [client.enqueue(f"n{i}", model="t", id=f"n{i}") for i in range(3)]
    bad = client.enqueue("x", model="t", id=BAD)
    neighbours += [client.enqueue(f"m{i}", model="t", id=f"m{i}") for i in range(3)]
    if case.inflight:
        claim_as_dead_worker(r, start=case.started)
    if case.outcome is None:
        r.delete(REQ, KEYS.result(BAD))  # only the garbage is left to find
        r.zrem(KEYS.pending, BAD)
    case.damage(r)

    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    try:
        for handle in neighbours:
            result = await asyncio.to_thread(handle.result, 20)
            assert result.ok and result.output == handle.id
        if case.outcome is not None:
            await check_outcome(bad, case.outcome)
        else:
            # the ghost sorts first (pending, delayed) or is met by the start-up reclaim
            # (inflight): by the time the neighbours are answered it has been dropped
            assert read_queue(r, KEYS).counters["garbage"] == case.garbage  # inferq stats
            assert worker.metrics.garbage.labels(KEYS.queue)._value.get() == case.garbage
            assert "dropped garbage key " + KEYS.request("ghost") in caplog.text
        # the worker is still serving
        later = client.enqueue("later", model="t")
        assert (await asyncio.to_thread(later.result, 20)).output == "later"
        assert not task.done()
    finally:
        await stop(worker, task)
    assert list(r.scan_iter(match=KEYS.prefix + "req:*")) == []
    assert r.zcard(KEYS.pending) == r.zcard(KEYS.inflight) == r.zcard(KEYS.delayed) == 0
    assert r.scard(KEYS.started) == 0
    if case.outcome is not None and case.outcome[1] == "corrupt_request":
        assert read_queue(r, KEYS).counters["corrupt"] == 1
        assert worker.metrics.corrupt.labels(KEYS.queue)._value.get() == 1


async def check_outcome(handle: inferq.Handle, outcome: tuple[str, str | None]) -> None:
    status, code = outcome
    if status == "ok":
        result = await asyncio.to_thread(handle.result, 20)
        assert result.ok
        return
    expected_error: type[Exception] = (inferq.DeadlineExceeded if status == "expired"
                                       else inferq.RequestFailed)
    with pytest.raises(expected_error) as info:
        await asyncio.to_thread(handle.result, 20)
    assert isinstance(info.value, inferq.RequestError)
    result = info.value.result
    assert result.status is Status(status)
    assert result.error is not None and result.error.code == code
    # readable in every way the API offers, with integer fields only
    peeked = handle.peek()
    assert peeked is not None and peeked.status is Status(status)
    assert isinstance(peeked.attempts, int)
    assert peeked.enqueued_ms is None or isinstance(peeked.enqueued_ms, int)
    assert isinstance(peeked.finished_ms, int)
    assert handle.status() == inferq.RequestState(status)
