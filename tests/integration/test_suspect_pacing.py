"""Pacing of suspects in RECLAIM (``lua/reclaim.lua``, ``suspect_delay_ms``): a run lost with
its worker for the first time reruns at once (a killed worker's batch is not delayed), but a
request lost again (a half of a crashed batch that crashed again: a crash poison's trail)
waits in ``delayed`` for the queue's next suspect slot, at least the delay after the loss and
after the previous slot, so a poison kills at most about one worker per delay."""

from __future__ import annotations

import pytest
import redis

import inferq
from inferq.protocol import ops
from inferq.protocol.fields import Field
from tests.integration.test_protocol import KEYS, TTL_MS, Scripts, enqueue

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")

DELAY_MS = 60_000  # far longer than the test: a paced request cannot come back by itself


@pytest.fixture
def scripts(r: redis.Redis) -> Scripts:
    return Scripts(r)


def _redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def lose(scripts: Scripts, owner: str, n: int, delay_ms: int = DELAY_MS) -> ops.ReclaimReply:
    """``owner`` claims and starts up to ``n`` requests, then dies: its leases expire and a
    sweep (leases only) takes them back."""
    claimed = scripts.claim(owner, n).claimed
    scripts.start(claimed)
    scripts.expire_all_leases()
    keys, args = ops.reclaim_call(KEYS, 100, TTL_MS, 100, suspect_delay_ms=delay_ms)
    return ops.parse_reclaim(scripts.s["reclaim"](keys=keys, args=args))


def state(r: redis.Redis, request_id: str) -> list[bytes | None]:
    return r.hmget(KEYS.request(request_id), Field.STATE, Field.LOST, Field.CAP)


def test_a_batch_lost_for_the_first_time_reruns_at_once(client: inferq.Client,
                                                        scripts: Scripts) -> None:
    for i in range(4):
        enqueue(client, f"x{i}", id=f"r{i}")
    reply = lose(scripts, "a", 4)
    assert (reply.requeued, reply.lost, reply.paced, reply.paced_in_ms) == (4, 4, 0, None)
    assert scripts.r.zcard(KEYS.pending) == 4 and scripts.r.zcard(KEYS.delayed) == 0
    again = scripts.claim("b", 4).claimed
    assert sorted(c.id for c in again) == ["r0", "r1", "r2", "r3"]
    assert {(c.lost, c.cap) for c in again} == {(1, 2)}
    assert scripts.r.hget(KEYS.stats, "suspects:next_at") is None


def test_a_request_lost_again_waits_for_the_suspect_slot_then_runs_with_its_cap(
        client: inferq.Client, scripts: Scripts) -> None:
    for i in range(4):
        enqueue(client, f"x{i}", id=f"r{i}")
    lose(scripts, "a", 4)  # the batch of 4: back at once, cap 2
    before = _redis_ms(scripts.r)
    reply = lose(scripts, "b", 2)  # a half of 2 crashes again: suspects
    after = _redis_ms(scripts.r)
    assert (reply.requeued, reply.lost, reply.paced) == (2, 2, 2)
    assert reply.paced_in_ms is not None and DELAY_MS - 1 <= reply.paced_in_ms <= DELAY_MS
    suspects = sorted(m.decode() for m in scripts.r.zrange(KEYS.delayed, 0, -1))
    assert len(suspects) == 2 and scripts.r.zcard(KEYS.pending) == 2
    for request_id in suspects:
        assert state(scripts.r, request_id) == [b"delayed", b"2", b"1"]
        due = scripts.r.zscore(KEYS.delayed, request_id)
        assert due is not None and before + DELAY_MS <= due <= after + DELAY_MS
    # The other half is served meanwhile; the suspects are not, and the claim says when.
    claim = scripts.claim("c", 4)
    assert sorted(c.id for c in claim.claimed) == sorted({"r0", "r1", "r2", "r3"}
                                                         - set(suspects))
    assert claim.next_retry_ms is not None and claim.next_retry_ms > DELAY_MS - 1_000
    # Their slot comes: they run, still capped (alone), no attempt used by the losses.
    for request_id in suspects:
        scripts.r.zadd(KEYS.delayed, {request_id: 0})
    due = scripts.claim("d", 4).claimed
    assert sorted(c.id for c in due) == suspects
    assert {(c.attempt, c.lost, c.cap) for c in due} == {(1, 2, 1)}


def test_suspect_groups_are_spaced_by_the_delay_for_the_whole_queue(
        client: inferq.Client, scripts: Scripts) -> None:
    for i in range(4):
        enqueue(client, f"x{i}", id=f"r{i}")
    lose(scripts, "a", 4)
    first = lose(scripts, "b", 1)  # r0 alone: lost again
    (r0,) = scripts.r.zrange(KEYS.delayed, 0, -1, withscores=True)
    second = lose(scripts, "c", 1)  # r1 alone, lost again right after: the next slot
    assert (first.paced, second.paced) == (1, 1)
    slots = dict(scripts.r.zrange(KEYS.delayed, 0, -1, withscores=True))
    assert len(slots) == 2
    later = max(slots.values())
    assert later >= r0[1] + DELAY_MS  # one delay after the previous group's slot
    assert int(scripts.r.hget(KEYS.stats, "suspects:next_at") or 0) == later + DELAY_MS


def test_without_a_delay_a_request_lost_again_reruns_at_once(
        client: inferq.Client, scripts: Scripts) -> None:
    for i in range(4):
        enqueue(client, f"x{i}", id=f"r{i}")
    lose(scripts, "a", 4, delay_ms=0)
    reply = lose(scripts, "b", 2, delay_ms=0)
    assert (reply.requeued, reply.paced) == (2, 0)
    assert scripts.r.zcard(KEYS.pending) == 4 and scripts.r.zcard(KEYS.delayed) == 0


def test_a_bad_delay_is_refused_before_any_write(client: inferq.Client,
                                                 scripts: Scripts) -> None:
    enqueue(client, "x", id="r0")
    scripts.start(scripts.claim("a", 1).claimed)
    scripts.expire_all_leases()
    keys, args = ops.reclaim_call(KEYS, 100, TTL_MS, 100)
    args[-1] = "soon"
    with pytest.raises(redis.ResponseError, match="bad arguments"):
        scripts.s["reclaim"](keys=keys, args=args)
    assert scripts.r.zcard(KEYS.inflight) == 1 and scripts.r.zcard(KEYS.pending) == 0
