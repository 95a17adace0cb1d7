"""Claims under cache affinity (``lua/includes/affinity.lua``) and the held sets workers publish
(``hold.lua``), against a real Redis: the preference, and each of its bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

import inferq
from inferq.protocol import ops, prefix
from inferq.protocol.codec import build_request
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys
from inferq.protocol.scripts import ALL

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")
KEYS = QueueKeys.for_model("generate", "m")
SYSTEM_A = "You answer questions about trains. " * 20
SYSTEM_B = "You answer questions about boats. " * 20


def run(r: redis.Redis, name: str, call: ops.Call) -> Any:
    keys, args = call
    return r.eval(ALL[name], len(keys), *keys, *args)


def hold(r: redis.Redis, worker: str, identities: list[str], ttl_ms: int = 60_000) -> int:
    return int(run(r, "hold", ops.hold_call(KEYS, worker, ttl_ms, identities)))


def claim(r: redis.Redis, worker: str, n: int, mode: str = "prefix",
          max_wait_ms: int = 60_000) -> ops.ClaimReply:
    return ops.parse_claim(run(r, "claim", ops.claim_call(
        KEYS, worker, 30_000, n, 60_000, affinity=mode, affinity_max_wait_ms=max_wait_ms)))


def chat(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def enqueue(client: inferq.Client, request_id: str, system: str, question: str = "q",
            **kw: Any) -> list[str]:
    """Queues a chat request; returns its identities (what a worker holds after running it)."""
    messages = chat(system, question)
    client.enqueue(model="m", task="generate", id=request_id, messages=messages, **kw)
    payload = build_request(
        "", id=request_id, task="generate", model="m", messages=messages,
        session=kw.get("session"), tenant=kw.get("tenant"))
    return prefix.identities_of(payload)


def ids(reply: ops.ClaimReply) -> list[str]:
    return [c.id for c in reply.claimed]


def test_a_claim_prefers_what_the_worker_holds(client: inferq.Client, r: redis.Redis) -> None:
    enqueue(client, "b1", SYSTEM_B)
    enqueue(client, "b2", SYSTEM_B)
    held = enqueue(client, "a1", SYSTEM_A)
    enqueue(client, "b3", SYSTEM_B)
    hold(r, "w1", held[:1])  # the shared system prompt only
    reply = claim(r, "w1", 1)
    assert ids(reply) == ["a1"] and reply.preferred == 1
    # the rest of the window: the plain order
    assert ids(claim(r, "w1", 2)) == ["b1", "b2"]


def test_the_longest_held_prefix_comes_first(client: inferq.Client, r: redis.Redis) -> None:
    turn1 = enqueue(client, "t1", SYSTEM_A, "first question")
    enqueue(client, "other", SYSTEM_A, "unrelated")
    messages = [*chat(SYSTEM_A, "first question"), {"role": "assistant", "content": "yes"},
                {"role": "user", "content": "and then?"}]
    client.enqueue(model="m", task="generate", id="t2", messages=messages)
    hold(r, "w1", turn1)  # the whole first turn: t2 extends it
    r.zrem(KEYS.pending, "t1")
    assert ids(claim(r, "w1", 1)) == ["t2"]


def test_without_a_held_set_or_with_affinity_off_the_head_comes_first(
        client: inferq.Client, r: redis.Redis) -> None:
    enqueue(client, "b1", SYSTEM_B)
    held = enqueue(client, "a1", SYSTEM_A)
    assert ids(claim(r, "w1", 1)) == ["b1"]  # w1 publishes nothing
    hold(r, "w1", held)
    enqueue(client, "b2", SYSTEM_B)
    reply = claim(r, "w1", 1, mode="")
    assert ids(reply) == ["a1"] and reply.preferred == 0  # off: a1 is simply the head now
    assert ids(claim(r, "w1", 1, mode="")) == ["b2"]


def test_priority_is_never_violated(client: inferq.Client, r: redis.Redis) -> None:
    held = enqueue(client, "low", SYSTEM_A, priority=0)
    enqueue(client, "high", SYSTEM_B, priority=5)
    hold(r, "w1", held)
    assert ids(claim(r, "w1", 1)) == ["high"]
    assert ids(claim(r, "w1", 1)) == ["low"]
    # a window of several: only the highest band present, whatever is held
    enqueue(client, "low2", SYSTEM_A, priority=0)
    enqueue(client, "high2", SYSTEM_B, priority=5)
    assert ids(claim(r, "w1", 5)) == ["high2"]


def test_a_passed_over_request_is_taken_first_once_its_max_wait_passed(
        client: inferq.Client, r: redis.Redis) -> None:
    enqueue(client, "b1", SYSTEM_B)
    held = enqueue(client, "a1", SYSTEM_A)
    enqueue(client, "a2", SYSTEM_A, "again")
    hold(r, "w1", held[:1])
    assert ids(claim(r, "w1", 1, max_wait_ms=500)) == ["a1"]
    # b1 was passed over: the time is noted (the Redis clock), once
    first = int(r.hget(KEYS.request("b1"), Field.SKIPPED) or 0)
    assert first > 0
    # within its max wait it is still passed over, and its first time kept
    assert ids(claim(r, "w1", 1, max_wait_ms=60_000)) == ["a2"]
    assert int(r.hget(KEYS.request("b1"), Field.SKIPPED) or 0) == first
    # once max wait has passed since then (simulated: the note moved 500 ms back), it comes
    # before any preference
    enqueue(client, "a3", SYSTEM_A, "third")
    r.hset(KEYS.request("b1"), Field.SKIPPED, first - 500)
    assert ids(claim(r, "w1", 1, max_wait_ms=500)) == ["b1"]


def test_only_what_the_plain_claim_would_have_taken_is_noted(
        client: inferq.Client, r: redis.Redis) -> None:
    for i in range(4):
        enqueue(client, f"b{i}", SYSTEM_B, str(i))
    held = enqueue(client, "a1", SYSTEM_A)
    hold(r, "w1", held[:1])
    assert ids(claim(r, "w1", 2)) == ["a1", "b0"]
    noted = [i for i in range(4) if r.hexists(KEYS.request(f"b{i}"), Field.SKIPPED)]
    assert noted == [1]  # a claim of 2 without affinity takes b0, b1: b1 was passed over


def test_session_mode_matches_sessions_only(client: inferq.Client, r: redis.Redis) -> None:
    enqueue(client, "same-prompt", SYSTEM_A)
    session = enqueue(client, "s1", SYSTEM_B, session="conv-1")
    held_prompt = enqueue(client, "x", SYSTEM_A)
    r.zrem(KEYS.pending, "x")
    hold(r, "w1", held_prompt + session[:1])
    assert ids(claim(r, "w1", 1, mode="session")) == ["s1"]
    # and a session counts above any prefix in prefix mode
    enqueue(client, "s2", SYSTEM_B, "later", session="conv-1")
    assert ids(claim(r, "w1", 1, mode="prefix")) == ["s2"]


def test_sessions_are_per_tenant(client: inferq.Client, r: redis.Redis) -> None:
    enqueue(client, "t-other", SYSTEM_B, tenant="acme", session="conv")
    mine = enqueue(client, "t-mine", SYSTEM_B, tenant="globex", session="conv")
    assert mine[0] != prefix.session_key("acme", "conv")
    hold(r, "w1", mine[:1])
    assert ids(claim(r, "w1", 1, mode="session")) == ["t-mine"]


def test_held_sets_expire_are_replaced_and_refuse_bad_input(r: redis.Redis) -> None:
    identities = [f"{i:016x}" for i in range(5)]
    assert hold(r, "w1", identities, ttl_ms=10_000) == 5
    key = KEYS.held("w1")
    assert r.smembers(key) == {i.encode() for i in identities}
    assert 0 < r.pttl(key) <= 10_000
    assert hold(r, "w1", identities[:2]) == 2 and r.scard(key) == 2  # replaced
    assert hold(r, "w1", [], ttl_ms=0) == 0 and not r.exists(key)   # a worker that stops
    with pytest.raises(redis.ResponseError, match="bad identity"):
        hold(r, "w1", ["not-hex"])
    with pytest.raises(redis.ResponseError, match="bad arguments"):
        hold(r, "w1", [f"{i:016x}" for i in range(prefix.MAX_HELD + 2)])
    assert not r.exists(key)


def test_damaged_entries_fail_alone_and_get_no_hash(client: inferq.Client,
                                                    r: redis.Redis) -> None:
    held = enqueue(client, "a1", SYSTEM_A)
    enqueue(client, "b1", SYSTEM_B)
    # a pending id without its hash (garbage), at the head of the same band
    r.zadd(KEYS.pending, {"ghost": int(r.zscore(KEYS.pending, "a1") or 0) - 1})
    hold(r, "w1", held)
    reply = claim(r, "w1", 1)
    assert ids(reply) == ["a1"]
    assert not r.exists(KEYS.request("ghost"))  # passed over, yet no hash was made for it
    reply = claim(r, "w1", 2)
    assert ids(reply) == ["b1"] and reply.garbage == [KEYS.request("ghost")]


def test_the_queue_settings_are_set_and_shown_by_the_cli(
        redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from inferq.cli.main import main

    assert main(["queue", "show", "generate:m", "--redis-url", redis_url]) == 0
    assert "affinity off, max wait 500 ms" in capsys.readouterr().out
    assert main(["queue", "set", "generate:m", "--affinity", "prefix",
                 "--affinity-max-wait-ms", "250", "--redis-url", redis_url]) == 0
    assert "affinity prefix, max wait 250 ms" in capsys.readouterr().out
    assert main(["queue", "show", "generate:m", "--json", "--redis-url", redis_url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["affinity"] == "prefix" and data["affinity_max_wait_ms"] == 250
    assert main(["queue", "set", "generate:m", "--affinity-max-wait-ms", "-1",
                 "--redis-url", redis_url]) == 2
    assert "affinity_max_wait_ms must be an integer in 0..600000" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["queue", "set", "generate:m", "--affinity", "sometimes", "--redis-url", redis_url])


def live(r: redis.Redis, worker: str, alive: bool = True) -> None:
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    r.zadd(KEYS.workers, {worker: now_ms + (60_000 if alive else -1000)})


def test_a_request_another_worker_holds_is_left_to_it_until_saturated_or_due(
        client: inferq.Client, r: redis.Redis) -> None:
    theirs = enqueue(client, "a1", SYSTEM_A)
    enqueue(client, "b1", SYSTEM_B)
    live(r, "w1")
    live(r, "w2")
    hold(r, "w2", theirs[:1])
    reply = claim(r, "w1", 1, max_wait_ms=1500)  # w1 holds nothing: a1 is w2's
    assert ids(reply) == ["b1"] and reply.preferred == 0
    assert reply.next_retry_ms is not None and 0 < reply.next_retry_ms <= 1500
    assert ids(claim(r, "w1", 1, max_wait_ms=1500)) == []   # only w2's request is left
    # w2 is saturated: anyone takes it (sticky until saturated)
    hold(r, "w2", [*theirs[:1], prefix.SATURATED])
    assert ids(claim(r, "w1", 1)) == ["a1"]


def test_a_left_request_is_due_after_max_wait_and_dead_holders_do_not_count(
        client: inferq.Client, r: redis.Redis) -> None:
    theirs = enqueue(client, "a1", SYSTEM_A)
    live(r, "w1")
    live(r, "w2")
    hold(r, "w2", theirs)
    assert ids(claim(r, "w1", 1)) == []
    first = int(r.hget(KEYS.request("a1"), Field.SKIPPED) or 0)
    r.hset(KEYS.request("a1"), Field.SKIPPED, first - 500)  # 500 ms passed
    assert ids(claim(r, "w1", 1, max_wait_ms=500)) == ["a1"]
    # a holder whose liveness lapsed holds nothing anyone waits for
    theirs = enqueue(client, "a2", SYSTEM_A, "again")
    live(r, "w2", alive=False)
    assert ids(claim(r, "w1", 1)) == ["a2"]


def test_the_holder_with_the_longest_prefix_wins(client: inferq.Client,
                                                 r: redis.Redis) -> None:
    turn = enqueue(client, "t1", SYSTEM_A, "first question")
    live(r, "w1")
    live(r, "w2")
    hold(r, "w1", turn[:1])   # the system prompt
    hold(r, "w2", turn)       # the whole conversation so far
    assert ids(claim(r, "w1", 1)) == []
    assert ids(claim(r, "w2", 1)) == ["t1"]
