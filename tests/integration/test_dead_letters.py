"""Dead letters an operator acts on (``inferq.deadletters``, ``requeue.lua``, ``purge.lua``)
and the request lookup, against a real server: through the SDK, the async SDK and the CLI."""

from __future__ import annotations

import json
import threading
from typing import Any

import msgpack
import pytest
import redis

import inferq
from inferq import deadletters
from inferq.cli.main import main
from inferq.protocol import ops
from inferq.protocol.codec import ErrorInfo, Result, Status, encode_result
from inferq.protocol.fields import Field
from inferq.stats import read_queue
from tests.integration.test_protocol import KEYS, Scripts

TTL_MS = 60_000
pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")


@pytest.fixture
def scripts(r: redis.Redis) -> Scripts:
    return Scripts(r)


def kill_by_worker(scripts: Scripts, n: int, code: str = "model_error",
                   cap: int = 100) -> list[ops.Claimed]:
    """Claim n, and answer each 'dead' with an error ``code`` as a worker would."""
    claimed = scripts.claim("w1", n).claimed
    scripts.start(claimed)
    rows = [ops.Completion(c, Status.DEAD.value, encode_result(Result(
        id=c.id, status=Status.DEAD, attempts=c.attempt,
        error=ErrorInfo(code=code, message=f"boom {c.id}"))))
        for c in claimed]
    keys, args = ops.complete_call(KEYS, TTL_MS, cap, rows)
    assert all(ops.parse_complete(scripts.s["complete"](keys=keys, args=args)))
    return claimed


def kill_by_reclaim(scripts: Scripts, n: int, cap: int = 100) -> None:
    """Claim n, start each alone on a worker of its own and lose them with their workers:
    with one crash allowed, each is dead-lettered ``crashed_worker``."""
    for i in range(n):
        scripts.start(scripts.claim(f"w2-{i}", 1).claimed)
    scripts.expire_all_leases()
    assert scripts.reclaim(dead_cap=cap, max_crashes=1)[1] == n


def test_both_ways_to_die_keep_a_record_that_lists_with_its_error(
        client: inferq.Client, scripts: Scripts) -> None:
    client.enqueue("first poison", model="m", id="a1", max_attempts=1, priority=7)
    kill_by_worker(scripts, 1)
    client.enqueue("lost twice", model="m", id="b1", max_attempts=1, priority=-3)
    kill_by_reclaim(scripts, 1)
    report = client.dead_letters(model="m").list()
    assert report.total == 2 and report.cap == 100 and report.dropped == 0
    by_id = {x.id: x for x in report.letters}
    assert report.letters[0].id == "b1"  # newest first
    a1, b1 = by_id["a1"], by_id["b1"]
    assert (a1.error_code, a1.error_message, a1.priority) == ("model_error", "boom a1", 7)
    assert a1.prompt_head() == "first poison" and a1.requeueable
    assert b1.error_code == "crashed_worker" and "running alone" in b1.error_message
    assert (b1.priority, b1.attempts, b1.max_attempts) == (-3, 0, 1)  # no attempt failed
    only = client.dead_letters(model="m").list(error_code="crashed_worker")
    assert [x.id for x in only.letters] == ["b1"]
    assert client.dead_letters(model="m").show("a1") == a1
    assert client.dead_letters(model="m").show("nope") is None


def test_requeue_keeps_id_priority_and_tenant_resets_attempts_and_is_idempotent(
        client: inferq.Client, scripts: Scripts, r: redis.Redis) -> None:
    client.enqueue("low", model="m", id="low", priority=1)
    handle = client.enqueue("again", model="m", id="x", max_attempts=2, priority=9,
                            deadline_s=600)
    # A field the worker does not know (fair sharing's tenant): it survives a requeue.
    r.hset(KEYS.request("x"), "tenant_extra", "acme")
    first = scripts.claim("w1", 1).claimed  # x: higher priority
    assert [c.id for c in first] == ["x"]
    score = r.hget(KEYS.request("x"), Field.SCORE)
    scripts.start(first)
    scripts.expire_all_leases()
    scripts.reclaim()
    scripts.start(scripts.claim("w1", 1).claimed)
    scripts.expire_all_leases()
    scripts.reclaim()
    with pytest.raises(inferq.RequestFailed):
        handle.result(timeout=1)
    letters = client.dead_letters(model="m")
    assert letters.show("x") is not None and letters.show("x").extra == {  # type: ignore[union-attr]
        "tenant_extra": "acme"}

    r.hset(KEYS.config, "max_depth", 1)  # an operator's requeue skips the depth limit
    done = letters.requeue(ids=["x"])
    assert done.outcomes == {"requeued": ["x"]}
    assert r.zscore(KEYS.pending, "x") == float(score)  # its priority and place
    h = r.hgetall(KEYS.request("x"))
    assert h[Field.ATTEMPTS.encode()] == b"0"
    assert h[Field.STATE.encode()] == b"pending"
    assert h[b"tenant_extra"] == b"acme"
    assert Field.OWNER.encode() not in h and r.hget(KEYS.leases, "x") is None
    assert Field.DEADLINE.encode() not in h and Field.REPLY_TO.encode() not in h
    assert r.exists(KEYS.result("x")) == 0 and r.zcard(KEYS.dead) == 0
    assert r.hlen(KEYS.dead_letters) == 0
    # idempotent: the second call finds nothing to requeue, queues nothing twice
    assert letters.requeue(ids=["x"]).outcomes == {"absent": ["x"]}
    assert r.zcard(KEYS.pending) == 2
    assert letters.list().requeued == 1
    assert read_queue(r, KEYS).counters["dead_requeued"] == 1  # inferq stats shows it
    # it runs from attempt 1, ahead of the lower priority, and its result arrives
    again = scripts.claim("w1", 1).claimed
    assert [(c.id, c.attempt) for c in again] == [("x", 1)]
    assert scripts.complete(again[0], output="fine")
    assert client.handle("x", model="m").result(timeout=1).output == "fine"


def test_concurrent_requeues_queue_each_dead_letter_once(
        client: inferq.Client, scripts: Scripts, redis_url: str, r: redis.Redis) -> None:
    for i in range(20):
        client.enqueue("p", model="m", id=f"r{i}", max_attempts=1)
    kill_by_worker(scripts, 20)
    outcomes: list[dict[str, list[str]]] = []
    barrier = threading.Barrier(4)

    def requeue() -> None:
        with inferq.Client(redis_url) as c:
            barrier.wait()
            outcomes.append(c.dead_letters(model="m").requeue(error_code="model_error").outcomes)

    threads = [threading.Thread(target=requeue) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requeued = [i for o in outcomes for i in o.get("requeued", [])]
    assert sorted(requeued) == sorted(f"r{i}" for i in range(20))
    assert r.zcard(KEYS.pending) == 20 and r.zcard(KEYS.dead) == 0


def test_purge_filters_by_age_and_code_is_counted_and_idempotent(
        client: inferq.Client, scripts: Scripts, r: redis.Redis) -> None:
    for i in range(4):
        client.enqueue("p", model="m", id=f"r{i}", max_attempts=1)
    kill_by_worker(scripts, 2, code="model_error")
    kill_by_worker(scripts, 2, code="out_of_memory")
    (now_s, _) = r.time()
    r.zadd(KEYS.dead, {"r0": (now_s - 3600) * 1000})  # died an hour ago
    letters = client.dead_letters(model="m")
    assert [x.id for x in letters.list(older_than_s=600).letters] == ["r0"]
    assert letters.purge(older_than_s=600).outcomes == {"purged": ["r0"]}
    assert letters.purge(ids=["r0"]).outcomes == {"absent": ["r0"]}
    assert sorted(letters.purge(error_code="out_of_memory").outcomes["purged"]) == ["r2", "r3"]
    report = letters.list()
    assert [x.id for x in report.letters] == ["r1"] and report.purged == 3
    assert r.hkeys(KEYS.dead_letters) == [b"r1"]
    # the purged ones' results stay readable until their TTL
    assert client.handle("r2", model="m").peek() is not None


def test_the_cap_is_visible_and_what_falls_off_is_counted(
        client: inferq.Client, scripts: Scripts, r: redis.Redis) -> None:
    for i in range(5):
        client.enqueue("p", model="m", id=f"r{i}", max_attempts=1)
    kill_by_reclaim(scripts, 5, cap=3)
    report = client.dead_letters(model="m").list()
    assert (report.total, report.cap, report.dropped) == (3, 3, 2)
    assert r.hlen(KEYS.dead_letters) == 3  # the records left with their ids


def test_large_sets_page_through_and_limit_counts_from_the_newest(
        client: inferq.Client, scripts: Scripts, r: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletters, "PAGE", 7)  # many pages of a small set
    for i in range(40):
        client.enqueue("p", model="m", id=f"r{i:02}", max_attempts=1)
    kill_by_worker(scripts, 20, code="model_error")
    kill_by_worker(scripts, 20, code="out_of_memory")
    for i in range(40):
        r.zadd(KEYS.dead, {f"r{i:02}": 1_000_000 + i})  # distinct times: r39 newest
    letters = client.dead_letters(model="m")
    assert len(letters.list(limit=None).letters) == 40
    assert [x.id for x in letters.list(limit=3).letters] == ["r39", "r38", "r37"]
    oom = letters.list(error_code="model_error", limit=None).letters
    assert [x.id for x in oom] == [f"r{i:02}" for i in range(19, -1, -1)]
    assert len(letters.requeue(error_code="out_of_memory", limit=5).outcomes["requeued"]) == 5
    assert r.zcard(KEYS.pending) == 5


def test_a_dead_letter_without_record_can_be_purged_not_requeued(
        client: inferq.Client, r: redis.Redis) -> None:
    r.zadd(KEYS.dead, {"old": 1000})  # dead-lettered by an inferq without records
    letters = client.dead_letters(model="m")
    assert letters.show("old") is not None and not letters.show("old").requeueable  # type: ignore[union-attr]
    assert letters.requeue(ids=["old"]).outcomes == {"no_record": ["old"]}
    r.hset(KEYS.dead_letters, "old", msgpack.packb({"h": "garbage"}))
    assert letters.requeue(ids=["old"]).outcomes == {"no_record": ["old"]}
    assert letters.purge(ids=["old"]).outcomes == {"purged": ["old"]}


def test_a_live_request_with_the_same_id_is_not_overwritten(
        client: inferq.Client, scripts: Scripts, r: redis.Redis) -> None:
    client.enqueue("p", model="m", id="x", max_attempts=1)
    kill_by_worker(scripts, 1)
    r.delete(KEYS.result("x"))  # its result expired; the producer enqueues the id again
    client.enqueue("new", model="m", id="x")
    assert client.dead_letters(model="m").requeue(ids=["x"]).outcomes == {"live": ["x"]}
    assert r.zcard(KEYS.dead) == 1


async def test_the_async_sdk_has_the_same_surface(
        redis_url: str, client: inferq.Client, scripts: Scripts) -> None:
    client.enqueue("p", model="m", id="x", max_attempts=1)
    kill_by_worker(scripts, 1)
    async with inferq.AsyncClient(redis_url) as aclient:
        letters = aclient.dead_letters(model="m")
        assert [x.id for x in (await letters.list()).letters] == ["x"]
        assert (await letters.show("x")) is not None
        assert (await letters.requeue(ids=["x"])).count("requeued") == 1
        assert (await letters.purge(ids=["x"])).outcomes == {"absent": ["x"]}


def cli(capsys: pytest.CaptureFixture[str], redis_url: str, *argv: str) -> tuple[int, str, str]:
    code = main([*argv[:2], "--redis-url", redis_url, *argv[2:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_lists_shows_requeues_and_purges(
        client: inferq.Client, scripts: Scripts, redis_url: str, r: redis.Redis,
        capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        client.enqueue(f"prompt {i}", model="m", id=f"r{i}", max_attempts=1)
    kill_by_worker(scripts, 2, code="model_error")
    kill_by_worker(scripts, 1, code="out_of_memory")
    code, out, _ = cli(capsys, redis_url, "dead-letter", "list", "embed:m")
    assert code == 0 and "3 dead letter(s), cap 100, 0 fell off the cap" in out
    assert main(["stats", "--redis-url", redis_url, "--queue", "embed:m"]) == 0
    assert "dead-lettered 3 (cap 100, 0 fell off)" in capsys.readouterr().out
    assert "r0" in out and "[model_error] boom r0" in out and "'prompt 0'" in out
    code, out, _ = cli(capsys, redis_url, "dead-letter", "show", "embed:m", "--id", "r2")
    assert code == 0 and "error         [out_of_memory] boom r2" in out and "r0" not in out
    code, out, _ = cli(capsys, redis_url, "dead-letter", "list", "embed:m", "--json",
                       "--error-code", "model_error", "--limit", "1")
    assert [x["id"] for x in json.loads(out)["letters"]] == ["r1"] or \
        [x["id"] for x in json.loads(out)["letters"]] == ["r0"]
    code, _, err = cli(capsys, redis_url, "dead-letter", "purge", "embed:m")
    assert code == 2 and "--all" in err and r.zcard(KEYS.dead) == 3
    code, out, _ = cli(capsys, redis_url, "dead-letter", "requeue", "embed:m",
                       "--error-code", "model_error")
    assert code == 0 and "requeue: 2 requeued" in out and r.zcard(KEYS.pending) == 2
    code, out, _ = cli(capsys, redis_url, "dead-letter", "purge", "embed:m", "--all")
    assert code == 0 and "purge: 1 purged" in out and r.zcard(KEYS.dead) == 0
    with pytest.raises(SystemExit) as bad:
        cli(capsys, redis_url, "dead-letter", "list", "embed:m", "--older-than", "x")
    assert bad.value.code == 2 and "duration" in capsys.readouterr().err


def test_inferq_request_shows_a_request_in_any_queue_and_one_line_when_unknown(
        client: inferq.Client, scripts: Scripts, redis_url: str, r: redis.Redis,
        capsys: pytest.CaptureFixture[str]) -> None:
    client.enqueue("hello", model="m", id="ok1")
    client.enqueue("poison", model="m", id="dead1", max_attempts=1)
    claimed = scripts.claim("w7", 1).claimed
    assert scripts.complete(claimed[0], output={"text": "the answer"})
    code, out, _ = cli(capsys, redis_url, "request", "ok1")
    assert code == 0 and "state      ok" in out and "owner" in out
    assert "result     the answer" in out and "request ok1 in embed:m" in out
    kill_by_worker(scripts, 1)
    code, out, _ = cli(capsys, redis_url, "request", "dead1", "--json")
    found: dict[str, Any] = json.loads(out)
    assert found["state"] == "dead" and found["error"]["code"] == "model_error"
    assert found["dead_lettered_ms"] is not None and found["enqueued_ms"] <= found["now_ms"]
    r.delete(KEYS.result("dead1"))  # its result expired: the dead letter still tells
    code, out, _ = cli(capsys, redis_url, "request", "dead1")
    assert code == 0 and "state      dead" in out and "error      [model_error] boom dead1" in out
    client.enqueue("waiting", model="m", id="p1", priority=4)
    code, out, _ = cli(capsys, redis_url, "request", "p1")
    assert "state      pending" in out and "attempts   0 of 3" in out
    code, out, _ = cli(capsys, redis_url, "request", "nope")
    assert code == 1 and out.count("\n") == 1 and "unknown" in out


def test_a_sharded_queue_lists_and_requeues_dead_letters_in_every_shard(
        client: inferq.Client, r: redis.Redis) -> None:
    r.hset(KEYS.config, mapping={"shards": 2, "shards_seen": 2})
    ids = [f"s{i}" for i in range(12)]
    for request_id in ids:
        client.enqueue("p", model="m", id=request_id, max_attempts=1)
    for shard in (0, 1):
        keys = KEYS.for_shard(shard)
        s = ops.register(r)
        k, a = ops.claim_call(keys, "w", 30_000, 100, TTL_MS)
        claimed = ops.parse_claim(s["claim"](keys=k, args=a)).claimed
        assert claimed, f"shard {shard} got none of the ids"
        rows = [ops.Completion(c, Status.DEAD.value, encode_result(Result(
            id=c.id, status=Status.DEAD, error=ErrorInfo(code="model_error", message="x"))))
            for c in claimed]
        k, a = ops.complete_call(keys, TTL_MS, 100, rows)
        s["complete"](keys=k, args=a)
    letters = client.dead_letters(model="m")
    report = letters.list(limit=None)
    assert sorted(x.id for x in report.letters) == sorted(ids) and report.total == 12
    assert {x.shard for x in report.letters} == {0, 1}
    assert sorted(letters.requeue(error_code="model_error").outcomes["requeued"]) == sorted(ids)
    assert r.zcard(KEYS.pending) + r.zcard(KEYS.for_shard(1).pending) == 12
