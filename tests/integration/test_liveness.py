"""How RECLAIM notices a dead worker by its closed connections (``lua/reclaim.lua``), driven
with the connected workers a sweep would list: only a worker once seen connected is judged;
it is dead when it is still without a connection ``grace_ms`` after it was first seen
without one and has not beaten meanwhile; then every lease it held comes back at once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis

import inferq
from inferq.protocol import ops
from inferq.protocol.fields import Field
from tests.integration.test_protocol import KEYS, TTL_MS, Scripts, enqueue
from tests.support.processes import wait_until

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")


def _redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def scripts(r: redis.Redis) -> Scripts:
    return Scripts(r)


def sweep(scripts: Scripts, connected: Sequence[str] | None, *, grace_ms: int = 0,
          probe_ms: int = 0) -> ops.ReclaimReply:
    keys, args = ops.reclaim_call(KEYS, 100, TTL_MS, 100, grace_ms=grace_ms,
                                  connected=connected, probe_ms=probe_ms)
    return ops.parse_reclaim(scripts.s["reclaim"](keys=keys, args=args))


def beat(scripts: Scripts, worker: str) -> None:
    """A heartbeat a millisecond or more after the last one (the registry score moves)."""
    now = _redis_ms(scripts.r)
    wait_until(lambda: _redis_ms(scripts.r) > now, 5, "the Redis clock")
    scripts.heartbeat(worker, [])


def test_a_worker_seen_connected_then_gone_loses_every_lease_at_once(
        client: inferq.Client, scripts: Scripts) -> None:
    for i in range(3):
        enqueue(client, f"x{i}", id=f"r{i}")
    beat(scripts, "a")
    running = scripts.claim("a", 1).claimed  # its batch: r0, started
    scripts.start(running)
    scripts.claim("a", 2)  # r1, r2: in its window, not started
    assert sweep(scripts, ["a"]).dead_workers == []
    run_id = scripts.r.info("server")["run_id"]
    assert scripts.r.hget(KEYS.conns, "a") == f"up {run_id}".encode()
    gone = sweep(scripts, [])  # first seen without a connection: noted, nothing taken yet
    assert (gone.dead_workers, gone.requeued) == ([], 0)
    assert scripts.r.hget(KEYS.conns, "a") != b"up"
    reply = sweep(scripts, [])  # still gone after the grace (0 here), no beat: dead
    assert reply.dead_workers == ["a"]
    assert (reply.requeued, reply.unstarted, reply.lost, reply.dead) == (3, 2, 1, 0)
    assert scripts.r.zcard(KEYS.inflight) == 0 and scripts.r.zcard(KEYS.pending) == 3
    assert scripts.r.zscore(KEYS.workers, "a") is None and not scripts.r.exists(KEYS.conns)
    # r0 ran alone when its worker died: a crash, it runs alone next; no attempt used
    assert scripts.r.hmget(KEYS.request("r0"), Field.LOST, Field.CRASHES, Field.CAP,
                           Field.ATTEMPTS) == [b"1", b"1", b"1", b"0"]
    assert scripts.r.hmget(KEYS.request("r1"), Field.LOST, Field.CAP) == [None, None]


def test_a_worker_never_seen_connected_is_left_to_its_leases(
        client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    # registered by an older inferq's heartbeat: no conns mark, no named connection
    scripts.r.zadd(KEYS.workers, {"old": _redis_ms(scripts.r) + 60_000})
    scripts.claim("old", 1)
    for _ in range(3):
        assert sweep(scripts, ["other"]).dead_workers == []
    assert scripts.r.zcard(KEYS.inflight) == 1 and scripts.r.hget(KEYS.conns, "old") is None


def test_a_worker_that_beats_again_or_reconnects_is_not_dead(
        client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    beat(scripts, "c")
    scripts.claim("c", 1)
    sweep(scripts, ["c"])
    sweep(scripts, [])  # first seen without a connection
    beat(scripts, "c")  # it beat meanwhile (it reconnected between the listing and the call)
    assert sweep(scripts, []).dead_workers == []  # noted again, from now
    assert sweep(scripts, ["c"]).dead_workers == []  # connected again
    assert (scripts.r.hget(KEYS.conns, "c") or b"").startswith(b"up ")
    # and the grace is honoured: missing twice, but not for grace_ms yet
    sweep(scripts, [], grace_ms=60_000)
    assert sweep(scripts, [], grace_ms=60_000).dead_workers == []
    assert scripts.r.zcard(KEYS.inflight) == 1


def test_a_worker_seen_up_only_before_a_server_restart_is_left_to_its_leases(
        client: inferq.Client, scripts: Scripts) -> None:
    enqueue(client, "x", id="r1")
    beat(scripts, "d")
    scripts.claim("d", 1)
    # Its own beat marked it up (it came over a named connection of this run of the server).
    assert (scripts.r.hget(KEYS.conns, "d") or b"").startswith(b"up ")
    # Seen connected by an earlier run of the server (the mark survived in the AOF): after a
    # restart every client reconnects, so its absence proves nothing until it is seen again.
    scripts.r.hset(KEYS.conns, "d", "up 0123456789abcdef")
    for _ in range(3):
        assert sweep(scripts, []).dead_workers == []
    # noted missing by an earlier run, but it beat since (another score): it is alive
    scripts.r.hset(KEYS.conns, "d", "1 1 0123456789abcdef")
    assert sweep(scripts, []).dead_workers == []
    assert scripts.r.zcard(KEYS.inflight) == 1
    # noted missing by an earlier run and no beat since: it had lost its connections while
    # that server ran, and has not come back
    score = scripts.r.zscore(KEYS.workers, "d")
    scripts.r.hset(KEYS.conns, "d", f"1 {score:.0f} 0123456789abcdef")
    assert sweep(scripts, []).dead_workers == ["d"]
    assert scripts.r.zcard(KEYS.inflight) == 0


def test_one_listing_is_asked_for_per_probe_interval_for_the_whole_fleet(
        scripts: Scripts) -> None:
    assert sweep(scripts, None, probe_ms=60_000).probe_due
    assert not sweep(scripts, None, probe_ms=60_000).probe_due  # another worker's sweep
    assert not sweep(scripts, None).probe_due  # probe_ms 0: never asked
