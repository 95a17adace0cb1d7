"""The Lua scripts against a real server: ordering, idempotency, back-pressure, leases."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import pytest
import redis
from pydantic import ConfigDict

import inferq
from inferq.protocol import ops
from inferq.protocol.codec import WIRE_VERSION, Result, Status, decode_result, encode_result
from inferq.protocol.fields import Field
from inferq.protocol.keys import QueueKeys

KEYS = QueueKeys.for_model("embed", "m")
TTL_MS = 60_000


class Scripts:
    """Direct access to the scripts, as a worker would call them."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.s = ops.register(r)

    def claim(self, owner: str, n: int, lease_ms: int = 30_000) -> ops.ClaimReply:
        keys, args = ops.claim_call(KEYS, owner, lease_ms, n, TTL_MS)
        return ops.parse_claim(self.s["claim"](keys=keys, args=args))

    def complete(self, claimed: ops.Claimed, output: Any = "out",
                 status: Status = Status.OK) -> bool:
        body = encode_result(Result(id=claimed.id, status=status, output=output,
                                    attempts=claimed.attempt))
        keys, args = ops.complete_call(
            KEYS, TTL_MS, 100, [ops.Completion(claimed, status.value, body)])
        return ops.parse_complete(self.s["complete"](keys=keys, args=args))[0]

    def start(self, claimed: list[ops.Claimed]) -> list[str]:
        """START: the model is about to run these (their attempt now counts)."""
        keys, args = ops.start_call(KEYS, [(c.id, c.token) for c in claimed])
        return ops.parse_ids(self.s["start"](keys=keys, args=args))

    def heartbeat(self, worker: str, leases: list[tuple[str, str]],
                  lease_ms: int = 30_000) -> list[str]:
        keys, args = ops.heartbeat_call(KEYS, worker, lease_ms, 10_000, leases)
        return ops.parse_ids(self.s["heartbeat"](keys=keys, args=args))

    def reclaim(self, dead_cap: int = 100, max_crashes: int = ops.DEFAULT_MAX_CRASHES
                ) -> tuple[int, int]:
        keys, args = ops.reclaim_call(KEYS, 100, TTL_MS, dead_cap, max_crashes=max_crashes)
        return ops.parse_reclaim(self.s["reclaim"](keys=keys, args=args)).counts

    def release(self, leases: list[tuple[str, str]]) -> int:
        keys, args = ops.release_call(KEYS, leases)
        return int(self.s["release"](keys=keys, args=args))

    def expire_all_leases(self) -> None:
        """Make every lease look expired (as if its worker died long ago)."""
        for member in self.r.zrange(KEYS.inflight, 0, -1):
            self.r.zadd(KEYS.inflight, {member: 0})


@pytest.fixture
def scripts(r: redis.Redis) -> Scripts:
    return Scripts(r)


def enqueue(client: inferq.Client, prompt: str, **kw: Any) -> inferq.Handle:
    return client.enqueue(prompt, model="m", **kw)


def test_priority_first_then_fifo_across_concurrent_producers(
        redis_url: str, scripts: Scripts) -> None:
    producers = 4
    per_producer = 60
    barrier = threading.Barrier(producers)
    enqueued: list[tuple[int, str]] = []  # (priority, id) in the order Redis accepted them
    lock = threading.Lock()

    def produce(p: int) -> None:
        client = inferq.Client(redis_url)
        barrier.wait()
        for i in range(per_producer):
            priority = (p + i) % 3 * 5  # 0, 5, 10 interleaved across producers
            handle = enqueue(client, f"p{p}-{i}", priority=priority, id=f"p{p}-{i}")
            with lock:
                enqueued.append((priority, handle.id))
        client.close()

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # FIFO within a priority follows Redis' own sequence: read it back from the scores.
    seq = {}
    for member, score in scripts.r.zrange(KEYS.pending, 0, -1, withscores=True):
        seq[member.decode()] = int(score) % (1 << 40)
    expected = sorted(enqueued, key=lambda e: (-e[0], seq[e[1]]))
    claimed = [c.id for c in scripts.claim("w", 1000).claimed]
    assert claimed == [request_id for _, request_id in expected]
    assert len(claimed) == producers * per_producer
    # Each producer's own requests of one priority keep their submission order.
    for p in range(producers):
        for priority in (0, 5, 10):
            mine = [i for i in claimed if i.startswith(f"p{p}-")
                    and dict((rid, pr) for pr, rid in enqueued)[i] == priority]
            assert mine == sorted(mine, key=lambda rid: int(rid.split("-")[1]))


def test_enqueue_is_idempotent_on_the_request_id(client: inferq.Client,
                                                 scripts: Scripts) -> None:
    first = enqueue(client, "hello", id="same")
    again = enqueue(client, "hello", id="same")
    assert first.outcome == "queued"
    assert again.outcome == "pending" and again.duplicate
    assert scripts.r.zcard(KEYS.pending) == 1
    claimed = scripts.claim("w", 10).claimed[0]
    assert enqueue(client, "hello", id="same").outcome == "inflight"
    assert scripts.complete(claimed)
    assert enqueue(client, "hello", id="same").outcome == "done"
    assert scripts.r.zcard(KEYS.pending) == 0
    assert first.result(timeout=1).output == "out"


def test_enqueue_many_is_one_round_trip_and_idempotent(client: inferq.Client,
                                                       scripts: Scripts) -> None:
    handles = client.enqueue_many(
        ["a", {"prompt": "b", "priority": 9, "id": "b"}, {"prompt": "b", "id": "b"}], model="m")
    assert [h.outcome for h in handles] == ["queued", "queued", "pending"]
    assert scripts.r.zcard(KEYS.pending) == 2
    assert scripts.claim("w", 10).claimed[0].id == "b"


def test_back_pressure_refuses_with_queue_full(redis_url: str, scripts: Scripts) -> None:
    flat = inferq.Shedding(levels=((inferq.PRIORITY_MIN, 1.0),))
    client = inferq.Client(redis_url, options=inferq.ClientOptions(max_queue_depth=3,
                                                                   shedding=flat))
    for i in range(3):
        enqueue(client, str(i))
    with pytest.raises(inferq.QueueFull) as info:
        enqueue(client, "overflow")
    assert info.value.depth == 3 and info.value.retry_after_s > 0
    assert info.value.code == "queue_full"
    with pytest.raises(inferq.QueueFull) as many:
        client.enqueue_many(["x", "y"], model="m")
    assert many.value.refused == [0, 1] and many.value.accepted == []
    scripts.claim("w", 1)  # depth counts pending requests: claiming one makes room
    assert enqueue(client, "fits now").outcome == "queued"
    assert scripts.r.zcard(KEYS.pending) == 3
    client.close()


def test_low_priority_is_shed_first_while_high_priority_still_gets_in(
        redis_url: str, scripts: Scripts) -> None:
    # Default shedding at depth 10: priority < 0 refused from 5, 0..49 from 8, >= 50 at 10.
    client = inferq.Client(redis_url, options=inferq.ClientOptions(max_queue_depth=10))
    for i in range(5):
        enqueue(client, f"bulk{i}", priority=-5)
    with pytest.raises(inferq.QueueFull) as low:
        enqueue(client, "one more bulk", priority=-5)
    assert low.value.max_depth == 5
    for i in range(3):
        enqueue(client, f"normal{i}")
    with pytest.raises(inferq.QueueFull):
        enqueue(client, "one more normal")
    enqueue(client, "urgent 1", priority=90)
    enqueue(client, "urgent 2", priority=90)
    with pytest.raises(inferq.QueueFull) as high:
        enqueue(client, "urgent 3", priority=90)
    assert high.value.max_depth == 10 and high.value.depth == 10
    client.close()


def test_retry_after_hint_follows_the_completion_rate(client: inferq.Client,
                                                      scripts: Scripts, r: redis.Redis) -> None:
    # 50 completions in the last 10 s (5/s); an excess of 1 should drain in ~0.2 s.
    now_s = int(r.time()[0])
    r.hset(KEYS.stats, mapping={f"ts:{(now_s - 2) % 64}": now_s - 2,
                                f"n:{(now_s - 2) % 64}": 50})
    small = inferq.Client(client.url, options=inferq.ClientOptions(
        max_queue_depth=1, shedding=inferq.Shedding(levels=((inferq.PRIORITY_MIN, 1.0),))))
    enqueue(small, "fills it")
    with pytest.raises(inferq.QueueFull) as info:
        enqueue(small, "refused")
    assert info.value.retry_after_s == pytest.approx(0.2)
    small.close()


def test_claim_records_owner_token_attempt_and_lease(client: inferq.Client,
                                                     scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    reply = scripts.claim("worker-a", 5, lease_ms=10_000)
    (claimed,) = reply.claimed
    assert (claimed.id, claimed.attempt) == ("r1", 1)
    assert claimed.token == f"worker-a/1/{reply.now_ms}"
    assert msgpack.unpackb(claimed.payload)["prompt"] == "x"
    state = {k.decode(): v.decode() for k, v in scripts.r.hgetall(KEYS.request("r1")).items()
             if k != b"p"}
    # the claim counts no attempt: START does, when the model is about to run it
    assert state["st"] == "inflight" and state["o"] == "worker-a" and state["a"] == "0"
    assert "t" not in state and scripts.r.hget(KEYS.leases, "r1") == claimed.token.encode()
    lease_deadline = scripts.r.zscore(KEYS.inflight, "r1")
    assert lease_deadline == pytest.approx(reply.now_ms + 10_000)
    assert scripts.claim("worker-b", 5).claimed == []


def test_heartbeat_extends_only_matching_tokens(client: inferq.Client,
                                                scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    claimed = scripts.claim("a", 1, lease_ms=1_000).claimed[0]
    before = scripts.r.zscore(KEYS.inflight, "r1")
    assert scripts.heartbeat("a", [("r1", claimed.token)], lease_ms=60_000) == []
    after = scripts.r.zscore(KEYS.inflight, "r1")
    assert after is not None and before is not None and after >= before + 59_000
    assert scripts.heartbeat("a", [("r1", "a/99")]) == ["r1"]
    assert scripts.r.zscore(KEYS.inflight, "r1") == after
    assert scripts.r.zscore(KEYS.workers, "a") is not None


def test_complete_is_token_checked_and_first_writer_wins(client: inferq.Client,
                                                         scripts: Scripts) -> None:
    handle = enqueue(client, "x", id="r1")
    first = scripts.claim("a", 1).claimed[0]
    assert scripts.complete(first, output="from a")
    assert not scripts.complete(first, output="again")  # a second write is refused
    assert handle.result(timeout=1).output == "from a"
    assert scripts.r.exists(KEYS.request("r1")) == 0
    assert scripts.r.zcard(KEYS.inflight) == 0
    assert 0 < scripts.r.pttl(KEYS.result("r1")) <= TTL_MS


def test_zombie_completion_after_takeover_is_refused(client: inferq.Client,
                                                     scripts: Scripts) -> None:
    handle = enqueue(client, "x", id="r1")
    zombie = scripts.claim("a", 1).claimed[0]
    assert scripts.start([zombie]) == []
    scripts.expire_all_leases()
    assert scripts.reclaim() == (1, 0)
    survivor = scripts.claim("b", 1).claimed[0]
    # a run lost with its worker is not an attempt; it is counted apart
    assert survivor.attempt == 1 and survivor.lost == 1 and survivor.token.startswith("b/1/")
    assert scripts.start([zombie]) == ["r1"]  # the zombie cannot start it either
    assert not scripts.complete(zombie, output="zombie")
    assert scripts.heartbeat("a", [("r1", zombie.token)]) == ["r1"]
    assert scripts.complete(survivor, output="survivor")
    result = handle.result(timeout=1)
    assert result.output == "survivor" and result.attempts == 1
    assert int(scripts.r.hget(KEYS.stats, "refused") or 0) == 1


def test_reclaim_keeps_the_original_score(client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "old", id="old", priority=1)
    scripts.claim("a", 1)
    enqueue(client, "new", id="new", priority=1)
    scripts.expire_all_leases()
    assert scripts.reclaim() == (1, 0)
    # The reclaimed request is older, so it is served before the newer one of equal priority.
    assert [c.id for c in scripts.claim("b", 2).claimed] == ["old", "new"]


def test_reclaim_dead_letters_a_request_lost_alone_max_crashes_times_as_crashed_worker(
        client: inferq.Client, scripts: Scripts) -> None:
    handle = enqueue(client, "poison", id="r1", max_attempts=1)
    for crash in range(1, ops.DEFAULT_MAX_CRASHES + 1):
        claimed = scripts.claim("a", 1).claimed
        assert [c.attempt for c in claimed] == [1]  # a lost run is not an attempt
        assert scripts.start(claimed) == []
        scripts.expire_all_leases()
        scripts.reclaim()
        if crash < ops.DEFAULT_MAX_CRASHES:  # lost while running alone: a crash, runs alone
            assert scripts.r.hmget(KEYS.request("r1"), Field.LOST, Field.CRASHES, Field.CAP,
                                   Field.ATTEMPTS) == [b"1", b"1", b"1", b"0"]
    assert scripts.r.zscore(KEYS.dead, "r1") is not None
    assert scripts.r.exists(KEYS.request("r1")) == 0
    with pytest.raises(inferq.RequestFailed) as info:
        handle.result(timeout=1)
    assert info.value.result.status is Status.DEAD
    assert info.value.error_code == "crashed_worker"
    assert "running alone 2 times" in (info.value.result.error.message
                                       if info.value.result.error else "")
    assert info.value.result.attempts == 0


def test_a_run_lost_in_a_batch_halves_the_batch_and_is_no_crash(
        client: inferq.Client, scripts: Scripts) -> None:
    for i in range(8):
        enqueue(client, "x", id=f"r{i}", max_attempts=1)
    enqueue(client, "waiting", id="w", priority=-1)
    batch = scripts.claim("a", 8).claimed
    assert [c.id for c in scripts.claim("a", 1).claimed] == ["w"]  # in the window, unstarted
    scripts.start(batch)
    scripts.expire_all_leases()
    assert scripts.reclaim() == (9, 0)
    assert int(scripts.r.hget(KEYS.stats, "lost_runs") or 0) == 8
    assert scripts.r.hmget(KEYS.request("w"), Field.LOST, Field.CAP) == [None, None]
    group = [f"r{i}" for i in range(8)]
    for cap in (4, 2, 1):  # bisection: the half holding r0 is lost again each time
        claimed = {c.id: c for c in scripts.claim(f"o{cap}", 9).claimed}
        assert {claimed[i].cap for i in group} == {cap}
        assert all(claimed[i].attempt == 1 for i in group)  # lost runs are not attempts
        group = group[:cap]
        scripts.start([claimed[i] for i in group])
        scripts.release([(i, c.token) for i, c in claimed.items() if i not in group])
        scripts.expire_all_leases()
        scripts.reclaim()
    # r0 was lost alone once (a crash); the others were never alone when a worker died
    fields = (Field.LOST, Field.CRASHES, Field.CAP, Field.ATTEMPTS)
    assert scripts.r.hmget(KEYS.request("r0"), *fields) == [b"4", b"1", b"1", b"0"]
    assert scripts.r.hmget(KEYS.request("r1"), *fields) == [b"3", b"0", b"1", b"0"]
    assert scripts.r.hmget(KEYS.request("r3"), *fields) == [b"2", b"0", b"2", b"0"]
    assert scripts.r.hmget(KEYS.request("r7"), *fields) == [b"1", b"0", b"4", b"0"]
    assert scripts.r.zcard(KEYS.dead) == 0


def test_dead_letter_set_is_capped(client: inferq.Client, scripts: Scripts) -> None:
    for i in range(5):
        enqueue(client, "p", id=f"r{i}", max_attempts=1)
    for i in range(5):  # each alone on a worker of its own: each a crash
        scripts.start(scripts.claim(f"a{i}", 1).claimed)
    scripts.expire_all_leases()
    assert scripts.reclaim(dead_cap=3, max_crashes=1) == (0, 5)
    assert scripts.r.zcard(KEYS.dead) == 3


def test_release_gives_claims_back_without_counting_the_attempt(
        client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", id="r1", priority=3)
    enqueue(client, "y", id="r2")
    claimed = scripts.claim("a", 2).claimed
    assert scripts.release([(c.id, c.token) for c in claimed]) == 2
    again = scripts.claim("b", 2).claimed
    assert [(c.id, c.attempt) for c in again] == [("r1", 1), ("r2", 1)]
    assert scripts.release([("r1", "a/1")]) == 0  # a stale token releases nothing


def test_a_request_past_its_deadline_is_answered_expired_without_running(
        client: inferq.Client, scripts: Scripts) -> None:
    handle = enqueue(client, "late", deadline_s=0.001)
    time.sleep(0.01)  # let Redis' clock pass the 1 ms deadline
    reply = scripts.claim("a", 10)
    assert reply.claimed == [] and reply.expired == 1
    with pytest.raises(inferq.DeadlineExceeded):
        handle.result(timeout=1)
    assert handle.status() is inferq.RequestState.EXPIRED


def test_an_expired_request_is_answered_when_a_claim_reaches_it_not_at_its_deadline(
        client: inferq.Client, scripts: Scripts) -> None:
    """The limit behind the chaos run's late answers: nothing sweeps `pending` for passed
    deadlines, so a low-priority request behind other work is answered `expired` only when a
    claim reaches it; a producer whose wait ends first gets `ResultTimeout`."""
    urgent = enqueue(client, "urgent", priority=5)
    late = enqueue(client, "late", priority=-10, deadline_s=0.001)
    time.sleep(0.01)  # let Redis' clock pass the 1 ms deadline
    with pytest.raises(inferq.ResultTimeout):
        late.result(timeout=0.05)
    reply = scripts.claim("a", 1)
    assert [c.id for c in reply.claimed] == [urgent.id] and reply.expired == 0
    assert late.status() is inferq.RequestState.PENDING  # past its deadline, still queued
    reply = scripts.claim("a", 1)
    assert reply.claimed == [] and reply.expired == 1
    with pytest.raises(inferq.DeadlineExceeded):
        late.result(timeout=1)


def test_claim_carries_the_absolute_deadline(client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", deadline_s=30)
    reply = scripts.claim("a", 1)
    deadline = reply.claimed[0].deadline_ms
    assert deadline is not None
    assert reply.claimed[0].enqueued_ms + 30_000 == deadline


def test_cancel_pending_and_running_requests(client: inferq.Client, scripts: Scripts) -> None:
    queued = enqueue(client, "x", id="queued")
    running = enqueue(client, "y", id="running", priority=5)
    claimed = scripts.claim("a", 1).claimed[0]
    assert claimed.id == "running"
    assert queued.status() is inferq.RequestState.PENDING
    assert running.status() is inferq.RequestState.RUNNING
    assert queued.cancel() and running.cancel()
    assert not queued.cancel()  # already finished
    assert scripts.r.zcard(KEYS.pending) == 0 and scripts.r.zcard(KEYS.inflight) == 0
    assert not scripts.complete(claimed)  # the worker's late completion is refused
    for handle in (queued, running):
        with pytest.raises(inferq.RequestCancelled):
            handle.result(timeout=1)


def test_result_blocks_until_written_without_polling(client: inferq.Client,
                                                     scripts: Scripts) -> None:
    handle = enqueue(client, "x", id="r1")
    claimed = scripts.claim("a", 1).claimed[0]
    got: list[Result] = []
    waiter = threading.Thread(target=lambda: got.append(handle.result(timeout=10)))
    waiter.start()
    assert scripts.complete(claimed, output=[1.0, 2.0])
    waiter.join(timeout=10)
    assert got and got[0].output == [1.0, 2.0]
    # Several readers can read the same result: BLMOVE rotates it in place.
    assert handle.result(timeout=1).output == [1.0, 2.0]
    assert decode_result(scripts.r.lindex(KEYS.result("r1"), 0)).id == "r1"


def test_result_timeout_raises_and_leaves_the_request_queued(client: inferq.Client) -> None:
    handle = enqueue(client, "x")
    with pytest.raises(inferq.ResultTimeout):
        handle.result(timeout=0.05)
    assert handle.status() is inferq.RequestState.PENDING


def test_failed_result_raises_request_failed_with_the_worker_code(
        client: inferq.Client, scripts: Scripts) -> None:
    handle = enqueue(client, "x")
    claimed = scripts.claim("a", 1).claimed[0]
    body = encode_result(Result(id=claimed.id, status=Status.FAILED,
                                error={"code": "invalid_input", "message": "bad"}))
    keys, args = ops.complete_call(KEYS, TTL_MS, 100, [ops.Completion(claimed,
                                                                 "failed", body)])
    scripts.s["complete"](keys=keys, args=args)
    with pytest.raises(inferq.RequestFailed) as info:
        handle.result(timeout=1)
    assert info.value.error_code == "invalid_input"


def test_oversized_prompt_is_refused_before_anything_is_queued(redis_url: str,
                                                                r: redis.Redis) -> None:
    small = inferq.Client(redis_url, options=inferq.ClientOptions(
        limits=inferq.Limits(max_prompt_bytes=100)))
    with pytest.raises(inferq.PayloadTooLarge):
        small.enqueue("x" * 101, model="m")
    with pytest.raises(inferq.ValidationError):
        small.enqueue("x", model="m", priority=500)
    assert r.dbsize() == 0
    small.close()


async def test_async_client_has_the_same_surface(redis_url: str, scripts: Scripts) -> None:
    async with inferq.AsyncClient(redis_url) as aclient:
        handle = await aclient.enqueue("x", model="m", id="a1", priority=2)
        many = await aclient.enqueue_many(["y", "z"], model="m")
        assert (await aclient.enqueue("x", model="m", id="a1")).duplicate
        assert await handle.status() is inferq.RequestState.PENDING
        assert [c.id for c in scripts.claim("w", 1).claimed] == ["a1"]
        assert await many[1].cancel()
        with pytest.raises(inferq.RequestCancelled):
            await many[1].result(timeout=1)
        with pytest.raises(inferq.ResultTimeout):
            await handle.result(timeout=0.05)
        claimed = [c for c in scripts.claim("w", 5).claimed]
        assert [c.id for c in claimed] == [many[0].id]


def test_module_level_enqueue_uses_the_env_url(redis_url: str, r: redis.Redis,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_REDIS_URL", redis_url)
    monkeypatch.setattr(inferq, "_default", None)
    handle = inferq.enqueue("hi", model="m")
    assert r.zscore(KEYS.pending, handle.id) is not None
    # Chat input, as on Client.enqueue: the messages travel in the payload, the prompt empty.
    chat = inferq.enqueue(messages=[{"role": "user", "content": "hi"}], model="m",
                          task="generate", params={"max_new_tokens": 4})
    gen_keys = QueueKeys.for_model("generate", "m")
    assert r.zscore(gen_keys.pending, chat.id) is not None
    payload = msgpack.unpackb(r.hget(gen_keys.request(chat.id), "p"))
    assert payload["messages"] == [{"role": "user", "content": "hi"}]
    inferq.default_client().close()
    monkeypatch.setattr(inferq, "_default", None)


def test_a_request_hash_without_payload_is_answered_not_dropped(
        client: inferq.Client, scripts: Scripts) -> None:
    handle = enqueue(client, "x", id="damaged")
    scripts.r.hdel(KEYS.request("damaged"), "p")
    assert scripts.claim("w", 5).claimed == []
    with pytest.raises(inferq.RequestFailed) as info:
        handle.result(timeout=1)
    assert info.value.error_code == "corrupt_request"
    assert scripts.r.exists(KEYS.request("damaged")) == 0


def test_a_claim_that_never_started_keeps_its_attempts_through_any_number_of_reclaims(
        client: inferq.Client, scripts: Scripts) -> None:
    handle = enqueue(client, "innocent", id="r1", max_attempts=2)
    for _ in range(5):  # five workers die with it claimed in their window, never run
        (claimed,) = scripts.claim("a", 1).claimed
        assert claimed.attempt == 1
        scripts.expire_all_leases()
        assert scripts.reclaim() == (1, 0)
    assert scripts.r.hget(KEYS.request("r1"), "a") == b"0"
    assert scripts.r.zscore(KEYS.dead, "r1") is None
    (claimed,) = scripts.claim("b", 1).claimed
    assert scripts.start([claimed]) == []
    assert scripts.complete(claimed, output="fine")
    assert handle.result(timeout=1).output == "fine"


def test_a_started_claim_lost_alone_is_a_suspect_and_uses_no_attempt(
        client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "suspect", id="r1", max_attempts=3)
    (claimed,) = scripts.claim("a", 1).claimed
    scripts.start([claimed])
    assert scripts.r.sismember(KEYS.started, "r1")
    scripts.expire_all_leases()
    assert scripts.reclaim() == (1, 0)
    assert not scripts.r.sismember(KEYS.started, "r1")
    (again,) = scripts.claim("b", 1).claimed
    # cap 1: the window worker runs it alone (``_release_batch``); no attempt was used
    assert (again.attempt, again.lost, again.cap) == (1, 1, 1)
    assert scripts.r.hmget(KEYS.request("r1"), Field.ATTEMPTS, Field.CRASHES) == [b"0", b"1"]


def test_release_undoes_a_start(client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    (claimed,) = scripts.claim("a", 1).claimed
    scripts.start([claimed])
    assert scripts.release([(claimed.id, claimed.token)]) == 1
    assert scripts.r.scard(KEYS.started) == 0
    assert scripts.claim("b", 1).claimed[0].attempt == 1


@pytest.mark.parametrize("blob", [b"", b"\xc1 not msgpack", msgpack.packb("one string"),
                                  msgpack.packb(["id", "token", "ok"]),  # neither pairs nor 5s
                                  msgpack.packb([["id", "token", "ok", "body", 0]]),
                                  msgpack.packb(list(range(10)))])  # numbers, not ids
def test_a_damaged_packed_argument_is_refused_before_anything_is_written(
        client: inferq.Client, scripts: Scripts, blob: bytes) -> None:
    """The per-request values travel as one msgpack argument (``ops.packed``): one that is not
    a flat array of width-sized runs of strings and numbers is refused with a clear error,
    and the request it names keeps its lease."""
    enqueue(client, "kept")
    [claimed] = scripts.claim("w1", 1).claimed
    keys, args = ops.complete_call(KEYS, TTL_MS, 100, [])
    for name, call in (("complete", (keys, [*args[:3], blob])),
                       ("start", (ops.start_call(KEYS, [])[0], [KEYS.prefix, blob])),
                       ("release", (ops.release_call(KEYS, [])[0], [KEYS.prefix, blob])),
                       ("heartbeat", (ops.heartbeat_call(KEYS, "w1", 1000, 1000, [])[0],
                                      ["", "w1", 1000, 1000, blob]))):
        with pytest.raises(redis.ResponseError, match=f"inferq {name}: bad arguments"):
            scripts.s[name](keys=call[0], args=call[1])
    assert scripts.r.hget(KEYS.leases, claimed.id) == claimed.token.encode()
    assert scripts.r.scard(KEYS.started) == 0
    assert scripts.complete(claimed)  # the lease is intact


def test_a_batch_of_completions_travels_as_one_argument(client: inferq.Client,
                                                        scripts: Scripts) -> None:
    for i in range(300):
        enqueue(client, f"request {i}")
    claimed = scripts.claim("w1", 300).claimed
    assert scripts.start(claimed) == []
    completions = [ops.Completion(c, "ok", encode_result(
        Result(id=c.id, status=Status.OK, output="é" * i, attempts=c.attempt)))
        for i, c in enumerate(claimed)]
    keys, args = ops.complete_call(KEYS, TTL_MS, 100, completions)
    assert len(args) == 4
    assert ops.parse_complete(scripts.s["complete"](keys=keys, args=args)) == [True] * 300
    for i, c in enumerate(claimed):
        assert decode_result(scripts.r.lindex(KEYS.result(c.id), 0)).output == "é" * i


class StrictResult(Result):
    """``Result`` refusing unknown fields: what a script writes must be a ``Result`` as
    Python defines it, field for field."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def test_every_result_a_script_writes_is_a_result(client: inferq.Client,
                                                  scripts: Scripts) -> None:
    enqueue(client, "late", id="expired", deadline_s=0.001, priority=9)
    enqueue(client, "x", id="damaged", priority=8)
    scripts.r.hdel(KEYS.request("damaged"), Field.PAYLOAD)
    enqueue(client, "x", id="dead", max_attempts=1, priority=7)
    cancelled = enqueue(client, "x", id="cancelled")
    time.sleep(0.01)  # let Redis' clock pass the 1 ms deadline
    scripts.start(scripts.claim("a", 3).claimed)
    scripts.expire_all_leases()
    assert scripts.reclaim(max_crashes=1) == (0, 1)
    assert cancelled.cancel()
    for request_id, status in (("expired", Status.EXPIRED), ("damaged", Status.FAILED),
                               ("dead", Status.DEAD), ("cancelled", Status.CANCELLED)):
        raw = scripts.r.lindex(KEYS.result(request_id), 0)
        strict = StrictResult.model_validate(msgpack.unpackb(raw, raw=False))
        assert (strict.id, strict.status, strict.v) == (request_id, status, WIRE_VERSION)
        assert strict.error is not None and strict.enqueued_ms and strict.finished_ms
