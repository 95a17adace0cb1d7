"""Redis Sentinel: a master, two replicas and three sentinels on loopback (real
``redis-server`` and ``redis-server --sentinel`` processes). A producer with
``durability="replica"`` and a worker process, both on a ``redis+sentinel://`` URL, run while
the master is SIGKILLed: the sentinels promote a replica, both carry on against it, and every
request whose enqueue was acknowledged gets its result; the CLI reads the promoted master."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

import inferq
from inferq.cli.main import main
from inferq.connection import ConnectionSettings, sync_client
from inferq.errors import ConfigError
from inferq.sentinel import parse
from tests.support.processes import WorkerProcess, wait_until
from tests.support.sentinel import SentinelDeployment

pytestmark = pytest.mark.filterwarnings("ignore::inferq.NoWorkerWarning")


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/mymaster/3"
    target = parse(url, "shown")
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (target.service, target.db, target.password) == ("mymaster", 3, "s@cret")
    settings = ConnectionSettings(url)
    assert "s%40cret" not in repr(settings) and "s@cret" not in repr(settings)
    for bad in ("redis+sentinel://h:1", "redis+sentinel://h:x/m", "redis+sentinel://h/m/db",
                "redis+sentinel://h/m?nope=1"):
        with pytest.raises(ConfigError):
            ConnectionSettings(bad)


def test_producer_and_worker_follow_a_failover_and_nothing_acknowledged_is_lost(
        tmp_path: Path) -> None:
    with SentinelDeployment(tmp_path) as deployment:
        url = deployment.url
        worker = WorkerProcess(url, "--model", "t=builtin:sleep?batch_ms=10",
                               "--worker-id", "sentinel-worker", log_dir=tmp_path)
        try:
            with sync_client(url) as r:
                wait_until(lambda: r.zscore("inferq:{embed:t}:workers", "sentinel-worker")
                           is not None, 60, "the worker on the master")
            client = inferq.Client(url, options=inferq.ClientOptions(durability="replica"))
            acknowledged: list[str] = []
            refused = 0
            errors: list[str] = []
            stop = threading.Event()

            def produce() -> None:
                nonlocal refused
                n = 0
                while not stop.is_set():
                    batch = [{"prompt": f"r{n + i}", "id": f"r{n + i}"} for i in range(10)]
                    n += 10
                    try:
                        acknowledged.extend(h.id for h in client.enqueue_many(batch, model="t"))
                    except (inferq.InferqError, redis.RedisError) as exc:
                        refused += 1  # not acknowledged: the producer would retry it
                        errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.02)

            producer = threading.Thread(target=produce)
            producer.start()
            try:
                wait_until(lambda: len(acknowledged) >= 200, 60, "load before the crash")
                deployment.kill_master()
                took = deployment.wait_failover()
                at_failover = len(acknowledged)
                try:
                    wait_until(lambda: len(acknowledged) >= at_failover + 200, 60,
                               "enqueues acknowledged by the promoted replica")
                except AssertionError:
                    raise AssertionError(f"{errors[-3:]}\n{worker.log[-3000:]}") from None
            finally:
                stop.set()
                producer.join()
            handles = [client.handle(i, model="t") for i in acknowledged]
            results = [h.result(timeout=120) for h in handles]
            assert all(res.ok and res.output == res.id for res in results)
            print(f"failover in {took:.1f} s; {len(acknowledged)} acknowledged, all answered; "
                  f"{refused} enqueue calls refused during the failover")
            # the CLI on the same URL reads the promoted master
            assert main(["stats", "--redis-url", url, "--queue", "embed:t"]) == 0
            assert worker.stop() == 0, worker.log
            client.close()
        finally:
            worker.stop()
