"""How a dead worker is noticed before its leases lapse: by its closed connections.

Every connection a worker opens is named after it (``CLIENT SETNAME``, done by redis-py at
each connect, reconnects included: ``client_name``). A worker killed with SIGKILL loses them at
once, and Redis knows. Each live worker's reclaim sweep lists the connected workers
(``connected_workers``: one ``CLIENT LIST``) and hands them to the RECLAIM script, which
compares them with the queue's registered workers and takes back every lease of one whose
connections have been gone for a grace period (``lua/reclaim.lua``). What a connection cannot
show (a paused process, a network partition that leaves the socket open) is still caught by
the lease.

Not on Redis Cluster (a worker's connections are spread over the nodes): leases only there.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

log = logging.getLogger("inferq.worker")

#: The name of every connection of a worker: this prefix and its id.
CLIENT_PREFIX = "inferq-worker:"
#: What a worker id may hold: a client name takes no spaces or control characters.
WORKER_ID_RE = re.compile(r"[!-~]{1,200}")


def client_name(worker_id: str) -> str:
    """The name of a worker's connections."""
    return CLIENT_PREFIX + worker_id


def parse_client_list(clients: list[dict[str, Any]]) -> list[str]:
    """The worker ids named by the connections of a ``CLIENT LIST`` reply."""
    ids: set[str] = set()
    for client in clients:
        name = client.get("name") or ""
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if name.startswith(CLIENT_PREFIX):
            ids.add(name[len(CLIENT_PREFIX):])
    return sorted(ids)


class LivenessProbe:
    """Lists the connected workers for the reclaim sweep; gives up for good (leases only) on
    a server or user that refuses ``CLIENT LIST`` (an ACL without it, a managed service), and
    on Redis Cluster."""

    def __init__(self, *, cluster: bool) -> None:
        self.enabled = not cluster

    async def connected_workers(self, redis: Any) -> list[str] | None:
        """The ids of the workers with a named connection now, or None (leases only)."""
        if not self.enabled:
            return None
        try:
            clients = await redis.client_list(_type="normal")
        except ResponseError as exc:
            if not refused_for_good(exc):
                log.warning("CLIENT LIST failed (%s): this sweep goes by the leases", exc)
                return None
            self.enabled = False
            log.warning("CLIENT LIST refused (%s): dead workers are noticed by their leases "
                        "only", exc)
            return None
        return parse_client_list(clients)


def refused_for_good(exc: ResponseError) -> bool:
    """An ACL without the command, or a server (a managed service, a proxy) that does not
    have it: asking again would not help. Anything else (a server loading its data after a
    restart) may pass."""
    text = str(exc).lower()
    return isinstance(exc, NoPermissionError) or "unknown" in text or "not allowed" in text
