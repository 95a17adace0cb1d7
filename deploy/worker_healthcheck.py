"""Container healthcheck for ``inferq worker`` (``python /opt/inferq/worker_healthcheck.py``).

Exit 0 while a worker of this container holds a live heartbeat in Redis, else exit 1. A worker's
default id starts with the host name, which Docker sets to the container id, so "this
container" is a live worker whose id starts with ``<hostname>-``. The heartbeat thread renews
the entry every lease/4 and it lapses after three of those, so "unhealthy" means: the model is still
loading, Redis is unreachable from here, or the heartbeat has stopped. A worker started with an
explicit ``--worker-id`` must keep that prefix for this check to see it.

The connection is ``$INFERQ_REDIS_URL`` and ``$INFERQ_TLS_CA/CERT/KEY``, as for every ``inferq``
command.
"""

from __future__ import annotations

import socket
import sys

import redis

from inferq.connection import ConnectionSettings, sync_client
from inferq.errors import ConfigError
from inferq.protocol.keys import QueueKeys
from inferq.stats import known_queues, live_workers, run


def local_live_workers(client: redis.Redis, hostname: str) -> list[str]:
    """Live workers (over every known queue) whose id says they run on ``hostname``."""
    prefix = f"{hostname}-"
    return sorted(w for queue in known_queues(client)
                  for w in run(client, live_workers(QueueKeys(queue)))
                  if w.startswith(prefix))


def main() -> int:
    hostname = socket.gethostname()
    try:
        settings = ConnectionSettings.from_env(socket_connect_timeout=5, retries=0)
        client = sync_client(settings, socket_timeout=5)
        try:
            workers = local_live_workers(client, hostname)
        finally:
            client.close()
    except (redis.RedisError, ConfigError) as exc:  # unreachable, or a bad URL / TLS file
        print(f"unhealthy: Redis: {exc}")
        return 1
    if not workers:
        print(f"unhealthy: no live worker of host {hostname} (loading, or heartbeat stopped)")
        return 1
    print("healthy: " + ", ".join(workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
