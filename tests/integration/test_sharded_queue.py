"""A queue split into shards, served by a window worker: it claims from every shard the queue
has had, keeps priority across shards, and loses nothing when the shard count changes.

The shard count is the queue's own setting (``config`` hash, written here directly); requests
are put into their shard with the enqueue script, as a sharding producer does."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import redis

from inferq.errors import InferqError
from inferq.protocol import ops, scores
from inferq.protocol.codec import RequestPayload, build_request, decode_result, encode_request
from inferq.protocol.keys import QueueKeys, shard_of
from inferq.worker.core import queue_link
from inferq.worker.models.base import BatchModel, ModelInput
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.window_worker import KEYS, config, run_worker, stop


class RecordingModel(BatchModel):
    """Echo that records the order it ran requests in; blocks its first batch on a gate."""

    tasks = frozenset({"*"})

    def __init__(self) -> None:
        self.model_id = "recording"
        self.order: list[str] = []
        self.gate = threading.Event()

    def prepare(self, payloads: Sequence[RequestPayload]) -> list[ModelInput | InferqError]:
        return [ModelInput(4, p.prompt) for p in payloads]

    def forward(self, batch: Sequence[ModelInput]) -> list[Any]:
        self.gate.wait(timeout=30)
        self.order += [item.data for item in batch]
        return [item.data for item in batch]


def set_shards(r: redis.Redis, shards: int, seen: int) -> None:
    r.hset(KEYS.config, mapping={"shards": shards, "shards_seen": seen})


def ids_in_shard(shard: int, shards: int, prefix: str, n: int) -> list[str]:
    found = (f"{prefix}{i}" for i in itertools.count())
    return list(itertools.islice((i for i in found if shard_of(i, shards) == shard), n))


def enqueue(r: redis.Redis, request_id: str, shards: int, priority: int = 0) -> QueueKeys:
    keys = KEYS.for_shard(shard_of(request_id, shards))
    payload = encode_request(build_request(request_id, id=request_id, task="embed", model="t",
                                           priority=priority))
    call_keys, args = ops.enqueue_call(
        keys, [ops.EnqueueItem(request_id, scores.band(priority), payload, None, 3)])
    reply = ops.parse_enqueue(ops.register(r)["enqueue"](keys=call_keys, args=args))
    assert reply.outcomes == ["queued"]
    return keys


def wait_raw(r: redis.Redis, key: str) -> Any:
    for _ in range(20):  # blocks until the result is written, under redis-py's read timeout
        raw = r.blmove(key, key, timeout=2)
        if raw is not None:
            return raw
    return None


def wait_result(r: redis.Redis, keys: QueueKeys, request_id: str) -> str:
    raw = wait_raw(r, keys.result(request_id))
    assert raw is not None, f"no result for {request_id}"
    result = decode_result(raw)
    assert result.ok, result
    return str(result.output)


async def test_a_sharded_queue_is_served_by_one_worker_with_nothing_lost(
        redis_url: str, r: redis.Redis) -> None:
    set_shards(r, 3, 3)
    ids = [f"req-{i}" for i in range(60)]
    placed = {request_id: enqueue(r, request_id, 3) for request_id in ids}
    assert {keys.shard for keys in placed.values()} == {0, 1, 2}
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    try:
        # one waiting thread: the event loop's default executor stays free for the worker
        outputs = await asyncio.to_thread(lambda: [wait_result(r, placed[i], i) for i in ids])
        assert outputs == ids
        # a request enqueued into shard 2 while the worker idles wakes it
        late = ids_in_shard(2, 3, "late-", 1)[0]
        assert await asyncio.to_thread(wait_result, r, enqueue(r, late, 3), late) == late
    finally:
        await stop(worker, task)
    for keys in KEYS.shards(3):
        assert r.zcard(keys.pending) == r.zcard(keys.inflight) == 0
        assert list(r.scan_iter(match=keys.prefix + "req:*")) == []


async def test_priority_holds_across_shards_on_a_backlog(redis_url: str,
                                                        r: redis.Redis) -> None:
    set_shards(r, 3, 3)
    low = ids_in_shard(0, 3, "low-", 12)
    high = ids_in_shard(2, 3, "high-", 12)
    placed = {i: enqueue(r, i, 3, priority=0) for i in low}
    placed.update({i: enqueue(r, i, 3, priority=5) for i in high})
    model = RecordingModel()
    model.gate.set()
    worker = WindowWorker(config(redis_url, max_batch_size=4), model)
    task = await run_worker(worker)
    try:
        for i in low + high:
            await asyncio.to_thread(wait_result, r, placed[i], i)
    finally:
        await stop(worker, task)
    # every high-priority request of shard 2 ran before any low one of shard 0, FIFO within
    assert model.order[:12] == high
    assert model.order[12:] == low


async def test_lowering_the_shard_count_on_a_live_queue_still_serves_old_shards(
        redis_url: str, r: redis.Redis) -> None:
    set_shards(r, 3, 3)
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    try:
        first = ids_in_shard(2, 3, "a-", 3)
        for i in first:
            assert await asyncio.to_thread(wait_result, r, enqueue(r, i, 3), i) == i
        # the operator lowers the count: new requests go to shard 0, the queue remembers 3
        model_paused = ids_in_shard(2, 3, "b-", 5)
        placed = {i: enqueue(r, i, 3) for i in model_paused}
        set_shards(r, 1, 3)
        placed.update({i: enqueue(r, i, 1) for i in ("c-1", "c-2")})
        for i, keys in placed.items():
            assert await asyncio.to_thread(wait_result, r, keys, i) == i
    finally:
        await stop(worker, task)
    for keys in KEYS.shards(3):
        assert r.zcard(keys.pending) == r.zcard(keys.inflight) == 0


async def test_raising_the_shard_count_on_a_live_queue_is_followed(
        redis_url: str, r: redis.Redis) -> None:
    worker = WindowWorker(config(redis_url), EchoModel())
    task = await run_worker(worker)
    try:
        assert await asyncio.to_thread(wait_result, r, enqueue(r, "one", 1), "one") == "one"
        set_shards(r, 3, 3)  # the worker reads the queue's settings again within a second
        later = ids_in_shard(2, 3, "x-", 2)
        placed = {i: enqueue(r, i, 3) for i in later}
        for i, keys in placed.items():
            assert await asyncio.to_thread(wait_result, r, keys, i) == i
    finally:
        await stop(worker, task)


async def test_a_generate_worker_serves_every_shard_and_streams_from_it(
        redis_url: str, r: redis.Redis, gen_worker: Any) -> None:
    from tests.support.generation import MODEL

    gen = QueueKeys.for_model("generate", MODEL)
    r.hset(gen.config, mapping={"shards": 2, "shards_seen": 2})
    scripts = ops.register(r)
    placed: dict[str, QueueKeys] = {}
    for i in range(6):
        request_id = f"g{i}"
        keys = gen.for_shard(shard_of(request_id, 2))
        payload = encode_request(build_request(
            "hello world", id=request_id, task="generate", model=MODEL,
            params={"max_new_tokens": 4}))
        call_keys, args = ops.enqueue_call(
            keys, [ops.EnqueueItem(request_id, scores.band(0), payload, None, 3)])
        scripts["enqueue"](keys=call_keys, args=args)
        placed[request_id] = keys
    assert {keys.shard for keys in placed.values()} == {0, 1}
    await gen_worker(max_slots=4)
    for request_id, keys in placed.items():
        key = keys.result(request_id)
        raw = await asyncio.to_thread(wait_raw, r, key)
        assert raw is not None and decode_result(raw).ok
        # the text went to the request's own shard's stream, ended by the end marker
        entries = r.xrange(keys.stream(request_id))
        assert entries and entries[-1][1] == {b"e": b"1"}
    for keys in gen.shards(2):
        assert r.zcard(keys.pending) == r.zcard(keys.inflight) == 0


async def test_many_shards_cost_a_group_of_peeks_per_round_within_the_stated_bound(
        redis_url: str, r: redis.Redis) -> None:
    """64 shards: a busy claim round peeks PEEK_SHARDS shards, not 64, and a better priority
    behind worse ones in other shards still runs within ceil(64 / PEEK_SHARDS) rounds."""
    shards, batch = 64, 4
    set_shards(r, shards, shards)
    low = [ids_in_shard(k, shards, f"low{k}-", 2) for k in range(shards)]
    placed = {i: enqueue(r, i, shards) for group in low for i in group}
    high = ids_in_shard(37, shards, "high-", 1)[0]  # outside the first group peeked
    placed[high] = enqueue(r, high, shards, priority=5)
    model = RecordingModel()
    model.gate.set()
    r.config_resetstat()
    worker = WindowWorker(config(redis_url, max_batch_size=batch), model)
    task = await run_worker(worker)
    try:
        for i in placed:
            await asyncio.to_thread(wait_result, r, placed[i], i)
    finally:
        await stop(worker, task)
    rounds = -(-shards // queue_link.PEEK_SHARDS)
    assert model.order.index(high) < rounds * batch
    assert sorted(model.order) == sorted(placed)
    # A PEEK reads two heads (ZRANGE): peeking at all 64 shards would cost ~128 a busy round
    # (4,417 in all, measured); a group of 8, 920 (idle rounds at the end peek at every shard).
    zrange = r.info("commandstats")["cmdstat_zrange"]["calls"]
    busy_rounds = len(placed) / batch
    assert zrange < busy_rounds * 2 * shards / 2
