"""Container healthcheck for ``inferq worker`` (``python /opt/inferq/worker_healthcheck.py``).

Exit 0 while a worker of this container holds a live heartbeat in Redis, else exit 1. A worker's
default id starts with the host name, which Docker sets to the container id, so "this
container" is a live worker whose id starts with ``<hostname>-``. The heartbeat thread renews
the entry every lease/3 and it lapses after one lease, so "unhealthy" means: the model is still
loading, Redis is unreachable from here, or the heartbeat has stopped. A worker started with an
explicit ``--worker-id`` must keep that prefix for this check to see it.

The Redis URL is ``$INFERQ_REDIS_URL`` (as for every ``inferq`` command).
"""

from __future__ import annotations

import socket
import sys

import redis

from inferq.producer.common import resolve_url
from inferq.stats import read_all


def local_live_workers(client: redis.Redis, hostname: str) -> list[str]:
    """Live workers (over every known queue) whose id says they run on ``hostname``."""
    prefix = f"{hostname}-"
    return sorted(w for queue in read_all(client) for w in queue.live_workers
                  if w.startswith(prefix))


def main() -> int:
    hostname = socket.gethostname()
    try:
        client = redis.Redis.from_url(resolve_url(None), socket_timeout=5,
                                      socket_connect_timeout=5)
        try:
            workers = local_live_workers(client, hostname)
        finally:
            client.close()
    except redis.RedisError as exc:
        print(f"unhealthy: Redis: {exc}")
        return 1
    if not workers:
        print(f"unhealthy: no live worker of host {hostname} (loading, or heartbeat stopped)")
        return 1
    print("healthy: " + ", ".join(workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
