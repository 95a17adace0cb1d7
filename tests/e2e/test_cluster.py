"""``inferq worker`` processes, the SDK and ``inferq stats`` on a real Redis Cluster started by
the test run: requests enqueued through every node, a worker killed mid-batch, a master
failover under load, and priority across the shards of a sharded queue."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import inferq
from inferq.cli.main import main
from inferq.protocol.keys import QueueKeys
from tests.support.cluster import LocalCluster, cluster_binary
from tests.support.processes import WorkerProcess, wait_until

SLOW = "slow=builtin:sleep?batch_ms=1500"


@pytest.fixture
def start_on(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(url: str, *args: str) -> WorkerProcess:
        worker = WorkerProcess(url, *args, log_dir=tmp_path)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_a_worker_serves_requests_enqueued_through_every_node_and_stats_read_them(
        redis_cluster: LocalCluster, cluster_url: str,
        start_on: Callable[..., WorkerProcess], capsys: pytest.CaptureFixture[str]) -> None:
    handles = []
    for i, node in enumerate(redis_cluster.masters):
        with inferq.Client(node.url) as client:
            handles += client.enqueue_many([f"n{i}-{j}" for j in range(10)], model="echo")
    worker = start_on(redis_cluster.masters[2].url, "--model", "echo=builtin:echo",
                      "--worker-id", "on-cluster")
    with inferq.Client(redis_cluster.masters[1].url) as client:
        results = [client.handle(h.id, model="echo").result(timeout=60) for h in handles]
    assert [r.output for r in results] == [f"n{i}-{j}" for i in range(3) for j in range(10)]
    assert {r.worker for r in results} == {"on-cluster"}
    assert main(["stats", "--json", "--redis-url", redis_cluster.masters[0].url]) == 0
    (stats,) = json.loads(capsys.readouterr().out)
    assert stats["queue"] == "embed:echo" and stats["counters"]["ok"] == 30
    assert stats["live_workers"] == ["on-cluster"] and stats["pending"] == 0
    assert worker.stop() == 0


def test_a_sigkilled_worker_on_the_cluster_loses_nothing(
        redis_cluster: LocalCluster, cluster_url: str,
        start_on: Callable[..., WorkerProcess]) -> None:
    keys = QueueKeys.for_model("embed", "slow")
    owner = redis_cluster.master_for(keys.pending)
    with inferq.Client(cluster_url) as client:
        handles = client.enqueue_many([f"req-{i}" for i in range(16)], model="slow")
        first = start_on(redis_cluster.masters[1].url, "--model", SLOW, "--lease-ms", "1500",
                         "--max-batch-size", "8", "--worker-id", "doomed")
        with owner.client() as direct:
            # mid-batch: its model has started some of what it holds
            wait_until(lambda: direct.scard(keys.started) > 0, 60, "the first worker's model")
            held = set(direct.zrange(keys.inflight, 0, -1))
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(timeout=10)
            ran = set(direct.smembers(keys.started))
        assert ran and ran <= held
        start_on(redis_cluster.masters[0].url, "--model", SLOW, "--lease-ms", "1500",
                 "--max-batch-size", "8", "--worker-id", "survivor")
        results = {r.id: r for r in (h.result(timeout=90) for h in handles)}
    assert sorted(r.output for r in results.values()) == sorted(f"req-{i}" for i in range(16))
    for request_id in held:  # a lost run is counted apart, not as an attempt; a claim is neither
        assert results[request_id].attempts == 1
        assert results[request_id].lost_runs == (1 if request_id in ran else None)
        assert results[request_id].worker == "survivor"


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[LocalCluster]:
    binary, reason = cluster_binary()
    if binary is None:
        pytest.skip(f"no server with cluster mode: {reason}")
    with LocalCluster(tmp_path / "cluster", masters=3, replicas=1, binary=binary) as cluster:
        yield cluster


def test_workers_go_on_by_themselves_through_master_failovers(
        replicated: LocalCluster, start_on: Callable[..., WorkerProcess]) -> None:
    keys = QueueKeys.for_model("embed", "echo")
    owner = replicated.master_for(keys.pending)
    entry = next(n for n in replicated.masters if n is not owner)  # never fails over
    workers = [start_on(entry.url, "--model", "echo=builtin:echo", "--worker-id", f"w{i}")
               for i in range(2)]
    options = inferq.ClientOptions(durability="replica")
    acknowledged: list[Any] = []
    with inferq.Client(entry.url, options=options) as client:
        acknowledged += client.enqueue_many([f"before-{i}" for i in range(20)], model="echo")
        # a manual failover: the replica takes over the queue's slot, the old master follows it
        replicated.failover(replicated.replica_of(owner))
        acknowledged += client.enqueue_many([f"after-{i}" for i in range(20)], model="echo")
        # then the new master dies outright; its replica (the old master) takes over again
        new_owner = replicated.master_for(keys.pending)
        new_owner.kill()
        replicated.wait_ok(timeout=30)
    with inferq.Client(entry.url) as client:
        acknowledged += client.enqueue_many([f"last-{i}" for i in range(10)], model="echo")
        results = [client.handle(h.id, model="echo").result(timeout=90) for h in acknowledged]
    assert [r.output for r in results] == (
        [f"before-{i}" for i in range(20)] + [f"after-{i}" for i in range(20)]
        + [f"last-{i}" for i in range(10)])
    assert all(w.proc.poll() is None for w in workers)  # they rode it out


def test_priority_holds_across_shards_on_a_backlog(
        redis_cluster: LocalCluster, cluster_url: str,
        start_on: Callable[..., WorkerProcess]) -> None:
    assert main(["queue", "set", "embed:echo", "--shards", "3", "--redis-url", cluster_url]) == 0
    with inferq.Client(cluster_url) as client:
        low = client.enqueue_many([f"low-{i}" for i in range(60)], model="echo", priority=-10)
        high = client.enqueue_many([f"high-{i}" for i in range(6)], model="echo", priority=50)
        assert len({h.keys.shard for h in low}) == 3
        start_on(cluster_url, "--model", "echo=builtin:echo", "--max-batch-size", "2")
        done = {r.id: r for r in (h.result(timeout=20) for h in [*low, *high])}
    last_high = max(done[h.id].finished_ms or 0 for h in high)
    low_before = [h for h in low if (done[h.id].finished_ms or 0) < last_high]
    # a claim never takes a low request while a high one heads any shard: at most the
    # batch in hand (2) can finish ahead of the last high request
    assert len(low_before) <= 2
