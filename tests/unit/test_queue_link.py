"""QueueLink's writes through a Redis outage: retried while the leases can be valid, then given
up (the queue reclaims the requests), never raised into the worker. No server: the writes are
stand-ins that fail on cue, the clock is ours."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from inferq.connection import ConnectionSettings
from inferq.protocol import ops
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import settings_from_hash
from inferq.worker.core.config import WorkerConfig
from inferq.worker.core.leases import LeaseBook
from inferq.worker.core.metrics import WorkerMetrics
from inferq.worker.core.queue_link import QueueLink
from inferq.worker.core.wake import WakeWaiter

LEASE_MS = 1_000

def completion(request_id: str, token: str, status: str, body: bytes) -> ops.Completion:
    return ops.Completion(ops.Claimed(request_id, b"", token, 1, 0, None), status, body)



class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_link(clock: Clock) -> tuple[QueueLink, LeaseBook]:
    config = WorkerConfig(connection=ConnectionSettings("redis://unused"), model_name="m",
                          model_spec="echo",
                          lease_ms=LEASE_MS, worker_id="w1")
    keys = QueueKeys.for_model("embed", "m")
    book = LeaseBook()
    for request_id in ("a", "b", "c"):
        book.add(request_id, f"token-{request_id}")
    return QueueLink(config, keys, book, WorkerMetrics(keys.queue, "w1"), clock), book


async def test_a_write_is_retried_through_a_blip_and_keeps_its_leases() -> None:
    clock = Clock()
    link, book = make_link(clock)
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RedisConnectionError("connection refused")
        return "written"

    assert await link.until_leases_expire(write, what="results", request_ids=["a", "b"]) \
        == "written"
    assert calls == 3
    assert len(book) == 3


async def test_a_write_is_given_up_once_its_leases_can_have_expired(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    link, book = make_link(clock)
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        clock.now += LEASE_MS / 1e3 * 0.6  # each failed attempt takes 0.6 of a lease
        raise RedisConnectionError("connection refused")

    with caplog.at_level(logging.ERROR, logger="inferq.worker"):
        assert await link.until_leases_expire(write, what="results",
                                               request_ids=["a", "b"]) is None
    assert calls == 2  # 0.6 lease: still valid, retried; 1.2 leases: given up
    assert [request_id for request_id, _ in book.snapshot()] == ["c"]
    assert "results: gave up" in caplog.text and "(2 finished)" in caplog.text


async def test_complete_gives_up_through_the_scripts_it_is_given() -> None:
    clock = Clock()
    link, book = make_link(clock)
    calls: list[str] = []

    def failing(name: str) -> Any:
        async def script(*, keys: list[str], args: list[object]) -> list[int]:
            calls.append(name)
            clock.now += LEASE_MS / 1e3  # the outage outlasts the lease at once
            raise RedisConnectionError("connection refused")
        return script

    link.attach(redis=None, scripts={"complete": failing("default")})
    completions = [completion("a", "token-a", "ok", b"r")]
    written = await link.complete(completions, scripts={"complete": failing("publisher")})
    assert written is None
    assert calls == ["publisher", "publisher"]  # the override, not the default connection
    assert [request_id for request_id, _ in book.snapshot()] == ["b", "c"]


async def test_claim_books_the_leases_and_sets_the_redis_clock() -> None:
    clock = Clock()
    link, book = make_link(clock)

    async def claim(*, keys: list[str], args: list[object]) -> list[object]:
        assert args[1:4] == ["w1", LEASE_MS, 2]  # owner, lease, how many
        rows = [[b"d", b"payload", b"token-d", 1, 1_000, b"", b"", b"", 0, 0, 0],
                [b"e", b"payload", b"token-e", 2, 2_000, 9_000, b"inbox-1", b"acme", 4, 1,
                 150]]
        # Redis time, claimed, expired, no retry due, no corrupt request, no garbage
        return [250_000, rows, 3, -1, [], []]

    class NoSettings:
        async def hgetall(self, key: str) -> dict[bytes, bytes]:
            assert key == link.keys.config
            return {}  # the queue's defaults: one shard, one CLAIM call

    link.attach(redis=NoSettings(), scripts={"claim": claim})
    reply = await link.claim(2)
    assert [c.id for c in reply.claimed] == ["d", "e"] and reply.claimed[1].deadline_ms == 9_000
    assert (reply.claimed[1].cap, reply.claimed[1].lost) == (4, 1)  # batch cap, lost runs
    assert [c.predicted_ms for c in reply.claimed] == [0, 150]  # admission's prediction
    assert dict(book.snapshot()) == {"a": "token-a", "b": "token-b", "c": "token-c",
                                     "d": "token-d", "e": "token-e"}
    assert link.now_ms() == 250_000  # our clock now reads on Redis' clock
    assert link.metrics.registry.get_sample_value(
        "inferq_expired_total", {"queue": link.keys.queue}) == 3


async def test_complete_forgets_the_leases_it_wrote_and_reports_refusals() -> None:
    clock = Clock()
    link, book = make_link(clock)
    seen: list[list[object]] = []

    async def complete(*, keys: list[str], args: list[object]) -> list[int]:
        seen.append(args)
        return [1, 0]  # b's lease was lost meanwhile

    link.attach(redis=None, scripts={"complete": complete})
    completions = [completion("a", "token-a", "ok", b"r"),
                   completion("b", "token-b", "ok", b"r")]
    assert await link.complete(completions) == [True, False]
    assert len(seen) == 1
    assert [request_id for request_id, _ in book.snapshot()] == ["c"]


async def test_release_on_a_redis_error_leaves_the_requests_to_expire() -> None:
    clock = Clock()
    link, book = make_link(clock)

    async def release(*, keys: list[str], args: list[object]) -> int:
        raise RedisConnectionError("connection refused")

    link.attach(redis=None, scripts={"release": release})
    assert await link.release([("a", "token-a"), ("b", "token-b")]) == 0
    assert [request_id for request_id, _ in book.snapshot()] == ["c"]


def test_times_are_put_on_the_redis_clock() -> None:
    clock = Clock()
    link, _ = make_link(clock)
    link.clock_offset_s = 1_000.0
    assert link.to_ms(5.0) == 1_005_000
    assert link.now_ms() == 1_100_000


def test_a_beat_that_finds_a_completing_lease_gone_does_not_call_it_lost() -> None:
    """The heartbeat snapshots the book, then its reply may land after a COMPLETE already
    removed some of those requests: they were finished, not lost."""
    book = LeaseBook()
    book.add_many([("a", "ta"), ("b", "tb"), ("c", "tc")])
    book.completing(["a", "b"])
    assert book.mark_lost(["a", "b", "c"]) == ["c"]
    assert not book.is_lost("a") and book.is_lost("c")
    book.drop_many(["a", "b"])
    assert len(book) == 0
    assert book.mark_lost(["a"]) == []  # dropped already: not lost either
    book.forget_lost(["c"])
    assert not book.any_lost()


class FakeRedis:
    """A client whose pipelines answer EVALSHA from ``replies`` (script name -> reply for
    the call's rows), recording each call as (script, first key, args). With ``outage``, every
    pipeline fails, each failure taking a lease of ``clock``'s time."""

    def __init__(self, replies: dict[str, Any], outage: Clock | None = None) -> None:
        self.replies = replies
        self.calls: list[tuple[str, str, list[Any]]] = []
        self.outage = outage
        self.failures = 0

    def pipeline(self, transaction: bool = False) -> Any:
        return FakePipe(self)


class FakePipe:
    def __init__(self, client: FakeRedis) -> None:
        self.client = client
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *command: Any) -> None:
        self.commands.append(command)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.client.outage is not None:
            self.client.failures += 1
            self.client.outage.now += LEASE_MS / 1e3
            raise RedisConnectionError("connection refused")
        out = []
        for _, sha, nkeys, *rest in self.commands:
            keys, args = rest[:nkeys], rest[nkeys:]
            self.client.calls.append((sha, keys[0], args))
            reply = self.client.replies[sha]
            out.append(reply(args) if callable(reply) else reply)
        return out


def fake_scripts(*names: str) -> dict[str, Any]:
    class Script:
        def __init__(self, name: str) -> None:
            self.sha = self.script = name

    return {name: Script(name) for name in names}


def delta(request_id: str, text: str = "x") -> ops.StreamDelta:
    return ops.StreamDelta(request_id, f"token-{request_id}", 1, text, (7,))


async def test_publish_writes_text_results_and_end_markers_in_one_round_trip() -> None:
    clock = Clock()
    link, book = make_link(clock)
    redis = FakeRedis({"stream": [b"b"], "complete": [1], "stream_end": 1})
    link.attach(redis=redis, scripts=fake_scripts("stream", "complete", "stream_end"))
    published = await link.publish([delta("a"), delta("b")],
                                   [completion("c", "token-c", "ok", b"r")])
    assert published is not None
    assert published.lost == {"b"} and published.written == [True]
    assert [name for name, _, _ in redis.calls] == ["stream", "complete", "stream_end"]
    stream_args = redis.calls[0][2]
    assert stream_args[2:] == ["a", "token-a", 1, "x", "7", "b", "token-b", 1, "x", "7"]
    assert redis.calls[2][2][2:] == ["c"]  # the end marker of the finished one
    assert [request_id for request_id, _ in book.snapshot()] == ["a", "b"]


#: Values per request in the complete script's packed rows (lua/complete.lua's header).
COMPLETE_ROW = 11


async def test_publish_routes_every_write_to_the_shard_of_its_lease() -> None:
    clock = Clock()
    link, book = make_link(clock)
    book.add("d", "token-d", shard=2)
    book.add("e", "token-e", shard=2)
    redis = FakeRedis({"stream": [], "complete": lambda args: [1] * (len(
        msgpack.unpackb(args[3])) // COMPLETE_ROW), "stream_end": 1})
    link.attach(redis=redis, scripts=fake_scripts("stream", "complete", "stream_end"))
    published = await link.publish(
        [delta("a"), delta("d")],
        [completion("e", "token-e", "ok", b"r"), completion("c", "token-c", "ok", b"r")])
    assert published is not None and published.written == [True, True]
    shard0, shard2 = link.keys.for_shard(0), link.keys.for_shard(2)
    assert [(name, key) for name, key, _ in redis.calls] == [
        ("stream", shard0.inflight), ("complete", shard0.inflight),
        ("stream_end", shard0.inflight), ("stream", shard2.inflight),
        ("complete", shard2.inflight), ("stream_end", shard2.inflight)]
    assert redis.calls[0][2][2] == "a" and redis.calls[3][2][2] == "d"
    assert redis.calls[2][2][2:] == ["c"] and redis.calls[5][2][2:] == ["e"]
    assert sorted(request_id for request_id, _ in book.snapshot()) == ["a", "b", "d"]


async def test_publish_gives_up_with_the_leases_and_through_the_pipeline_given() -> None:
    clock = Clock()
    link, book = make_link(clock)
    link.attach(redis=FakeRedis({}), scripts={})
    down = FakeRedis({}, outage=clock)

    class Pipeline:
        client = down
        scripts = fake_scripts("stream", "complete", "stream_end")

    published = await link.publish([delta("a")], [completion("c", "token-c", "ok", b"r")],
                                   pipeline=Pipeline())  # type: ignore[arg-type]
    assert published is None and down.failures == 2  # within the lease, retried; then not
    assert [request_id for request_id, _ in book.snapshot()] == ["a", "b"]


async def test_start_and_release_make_one_call_per_shard_of_their_leases() -> None:
    clock = Clock()
    link, book = make_link(clock)
    book.add("d", "token-d", shard=1)
    seen: list[tuple[str, str, list[Any]]] = []

    def script(name: str, reply: Any) -> Any:
        async def call(*, keys: list[str], args: list[Any]) -> Any:
            seen.append((name, keys[0], msgpack.unpackb(args[1])))
            return reply(keys[0])
        return call

    shard1 = link.keys.for_shard(1)
    link.attach(redis=None, scripts={
        "start": script("start", lambda key: [b"d"] if key == shard1.started else []),
        "release": script("release", lambda key: 1)})
    leases = [("a", "token-a"), ("d", "token-d"), ("b", "token-b")]
    assert await link.start(leases) == {"d"}
    assert book.is_lost("d")
    book.add("d", "token-d", shard=1)
    assert await link.release(leases) == 2
    assert seen == [("start", link.keys.started, ["a", "token-a", "b", "token-b"]),
                    ("start", shard1.started, ["d", "token-d"]),
                    ("release", link.keys.inflight, ["a", "token-a", "b", "token-b"]),
                    ("release", shard1.inflight, ["d", "token-d"])]
    assert [request_id for request_id, _ in book.snapshot()] == ["c"]


async def test_the_wake_lists_follow_the_shards_claims_come_from() -> None:
    clock = Clock()
    link, _ = make_link(clock)
    waiter = WakeWaiter(link.keys.wake)
    link.follow_shards(waiter)
    assert waiter.keys == [link.keys.wake]
    link.settings = settings_from_hash({b"shards": b"2", b"shards_seen": b"3"})
    link.follow_shards(waiter, "cancels")
    assert waiter.keys == ["cancels", *(link.keys.for_shard(k).wake for k in range(3))]
