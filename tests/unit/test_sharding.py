"""Pure parts of sharded queues and durable acknowledgements: routing a request to its shard
with its share of the depth limit, the settings cache, ``inferq queue set``'s arguments and
the durability checks' errors."""

from __future__ import annotations

import pytest
import redis

import inferq
from inferq import cluster
from inferq.connection import ConnectionSettings, is_cluster
from inferq.producer.prepare import Prepared, prepare
from inferq.producer.routing import SettingsCache, route
from inferq.protocol.keys import QueueKeys, shard_of
from inferq.protocol.settings import QueueSettings, settings_call

OPTIONS = inferq.ClientOptions(max_queue_depth=90,
                               shedding=inferq.Shedding(levels=((inferq.PRIORITY_MIN, 1.0),)))


def prepared(request_id: str) -> Prepared:
    return prepare("x", {"model": "m", "id": request_id}, OPTIONS)


def test_one_shard_keeps_todays_keys_and_limit() -> None:
    p = prepared("a")
    routed = route(p, QueueSettings(), OPTIONS)
    assert routed.keys == QueueKeys.for_model("embed", "m") and routed.keys.shard == 0
    assert routed.item.depth_limit == 90


def test_requests_go_to_the_shard_of_their_id_with_a_share_of_the_limit() -> None:
    settings = QueueSettings(shards=4, shards_seen=4, max_depth=10)
    shards = set()
    for i in range(40):
        routed = route(prepared(f"id{i}"), settings, OPTIONS)
        assert routed.keys.shard == shard_of(f"id{i}", 4)
        assert routed.item.depth_limit == 3  # ceil(10 / 4): the queue's own limit wins
        shards.add(routed.keys.shard)
    assert shards == {0, 1, 2, 3}
    unbounded = QueueSettings(shards=4, shards_seen=4, max_depth=0)
    assert route(prepared("z"), unbounded, OPTIONS).item.depth_limit == 0


def test_settings_are_read_again_once_their_ttl_passed() -> None:
    now = [0.0]
    cache = SettingsCache(1.0, clock=lambda: now[0])
    keys = QueueKeys.for_model("embed", "m")
    assert cache.get(keys) is None
    assert cache.put(keys, {b"shards": b"3"}).shards == 3
    now[0] = 0.9
    assert cache.get(keys) == QueueSettings(3, 3, None)
    now[0] = 1.0
    assert cache.get(keys) is None


def test_queue_set_arguments_are_checked() -> None:
    config = QueueKeys.for_model("embed", "m").config
    assert settings_call(config, 3, "keep") == ([config], ["3", ""])
    assert settings_call(config, None, None) == ([config], ["", "-"])
    assert settings_call(config, None, 0) == ([config], ["", "0"])
    with pytest.raises(inferq.ValidationError, match="shards"):
        settings_call(config, 0, "keep")
    with pytest.raises(inferq.ValidationError, match="max_depth"):
        settings_call(config, None, -1)


def test_durability_options_and_errors_are_clear() -> None:
    with pytest.raises(inferq.ValidationError, match="durability"):
        inferq.ClientOptions(durability="always")
    with pytest.raises(inferq.ValidationError, match="durability_timeout_s"):
        inferq.ClientOptions(durability="fsync", durability_timeout_s=0)
    assert cluster.wait_command("fsync", 2.0) == ("WAITAOF", "1", "0", "2000")
    assert cluster.wait_command("replica", 0.5) == ("WAIT", "1", "500")
    cluster.check_ack("fsync", [1, 0], 1.0, "n")
    cluster.check_ack("replica", 1, 1.0, "n")
    with pytest.raises(inferq.DurabilityError, match="fsync was not confirmed"):
        cluster.check_ack("fsync", [0, 0], 1.0, "n")
    with pytest.raises(inferq.DurabilityError, match="no replica"):
        cluster.check_ack("replica", 0, 1.0, "n")
    old = redis.ResponseError("unknown command 'WAITAOF', with args beginning with: ")
    with pytest.raises(inferq.DurabilityError, match="no WAITAOF"):
        cluster.check_ack("fsync", old, 1.0, "n")
    off = redis.ResponseError("WAITAOF cannot be used when numlocal is set but appendonly "
                              "is disabled.")
    with pytest.raises(inferq.DurabilityError, match="AOF is off") as err:
        cluster.check_ack("fsync", off, 1.0, "n")
    assert err.value.code == "durability_unconfirmed" and err.value.level == "fsync"


def test_cluster_mode_can_be_forced_without_asking_the_server() -> None:
    assert is_cluster(ConnectionSettings("redis://127.0.0.1:1/0", cluster=True))
    assert not is_cluster(ConnectionSettings("redis://127.0.0.1:1/0", cluster=False))
    # nobody answers: a single Redis, not remembered
    assert not is_cluster(ConnectionSettings("redis://127.0.0.1:1/0", retries=0))
    with pytest.raises(inferq.ConfigError, match="failover_timeout_s"):
        ConnectionSettings(failover_timeout_s=-1)


async def test_stats_gauges_and_readiness_sum_every_shard_the_queue_ever_had() -> None:
    import fakeredis

    from inferq.plans import run, run_async
    from inferq.protocol import scores
    from inferq.stats import all_live_workers, sharded_queue_stats
    from inferq.worker.core.metrics import WorkerMetrics

    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server)
    keys = QueueKeys.for_model("embed", "m")
    sync.hset(keys.config, mapping={"shards": 2, "shards_seen": 3})  # lowered from 3
    now_ms = int(sync.time()[0]) * 1000
    for k, n in ((0, 2), (2, 3)):
        shard = keys.for_shard(k)
        sync.zadd(shard.pending, {f"s{k}-{i}": scores.band(5) + i for i in range(n)})
        sync.hset(shard.stats, mapping={"ok": k + 1})
    sync.zadd(keys.for_shard(1).inflight, {"r": now_ms + 1000})
    sync.zadd(keys.for_shard(1).workers, {"w1": now_ms + 30_000})
    sync.zadd(keys.for_shard(2).workers, {"w1": now_ms + 30_000, "w2": now_ms + 30_000})
    stats = run(sync, sharded_queue_stats(keys))
    assert (stats.shards, stats.pending_by_priority, stats.inflight) == (3, {5: 5}, 1)
    assert stats.live_workers == ["w1", "w2"] and stats.counters == {"ok": 4}
    aio = fakeredis.FakeAsyncRedis(server=server)
    assert await run_async(aio, all_live_workers(keys)) == ["w1", "w2"]
    metrics = WorkerMetrics(keys.queue, "w1")
    await metrics.sample_queue(aio, keys, "cpu")
    assert metrics.inflight.labels(keys.queue)._value.get() == 1
    assert metrics.queue_depth.labels(keys.queue, "5")._value.get() == 5


def test_a_cluster_without_a_master_for_the_slot_is_backend_unavailable() -> None:
    from redis.exceptions import ClusterDownError, RedisClusterException

    from inferq.connection import wrap_connection_errors

    settings = ConnectionSettings("redis://:pw@127.0.0.1:7001/0")
    with pytest.raises(inferq.BackendUnavailable, match="no master for the slot") as down, \
            wrap_connection_errors(settings):
        raise ClusterDownError("The cluster is down")
    assert "pw" not in str(down.value)
    with pytest.raises(inferq.BackendUnavailable, match="any node"), \
            wrap_connection_errors(settings):
        raise RedisClusterException("Redis Cluster cannot be connected. Please provide ...")
    with pytest.raises(RedisClusterException, match="blocked"), \
            wrap_connection_errors(settings):
        raise RedisClusterException("ERROR: Calling pipelined function x is blocked")
