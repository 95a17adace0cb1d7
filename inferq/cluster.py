"""Redis Cluster support: cluster clients that ride out a failover, script pipelines that work
on both kinds of client, and writes acknowledged only once durable (WAITAOF / WAIT).

``inferq.connection`` detects cluster mode (``INFO cluster`` says ``cluster_enabled:1``) and
returns ``ClusterClient`` / ``AsyncClusterClient``: redis-py's cluster clients, which follow
``MOVED``/``ASK`` redirections and refresh the slot map themselves, plus one more layer: a
command that fails with a connection error, ``CLUSTERDOWN``, ``TRYAGAIN`` or ``MASTERDOWN``
(a master died and its replica is not promoted yet, slots are migrating) is retried with
jittered backoff for up to ``failover_timeout_s``. Every script inferq runs is safe to repeat
(enqueue is idempotent on the request id, completion is token-checked, first writer wins), so
a retried call never doubles a request.

Every inferq script declares all the keys of its queue shard it touches, and every key of one
shard carries the shard's hash tag, so each script call lives in one slot. redis-py's
``ClusterPipeline`` groups pipelined commands by node itself; ``run_scripts`` adds what it lacks
for scripts: a node that does not know a script (a new master after a failover: SCRIPT LOAD is
not replicated) gets it loaded, and only the refused calls run again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from inferq import plans
from inferq.errors import DurabilityError, ValidationError
from inferq.plans import Direct, Do, Pipeline, Plan, Sleep, call

T = TypeVar("T")

#: Errors of a cluster in motion (failover, resharding): retried until ``failover_timeout_s``.
RETRYABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError,
    MasterDownError, SlotNotCoveredError,
)
DEFAULT_FAILOVER_TIMEOUT_S = 20.0
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 1.0

Durability = str  # "fsync" | "replica"
DURABILITY_LEVELS = ("fsync", "replica")


def _delay(attempt: int) -> float:
    return float(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** attempt)))


def retrying(attempt: Callable[[], Plan[T]], timeout_s: float,
             refresh: Callable[[], Plan[Any]] | None = None) -> Plan[T]:
    """The one retry rule, as a plan: ``attempt()`` again after each ``RETRYABLE`` error, with
    jittered backoff, for ``timeout_s`` (0: no retry); ``refresh()`` before each new try."""
    give_up = time.monotonic() + timeout_s
    tries = 0
    while True:
        try:
            return (yield from attempt())
        except RETRYABLE:
            if time.monotonic() >= give_up:
                raise
            yield Sleep(_delay(tries))
            tries += 1
            if refresh is not None:
                yield from refresh()


def retry_sync(call: Callable[[], T], timeout_s: float) -> T:
    """``call()``, retried on ``RETRYABLE`` errors with jittered backoff for ``timeout_s``."""
    result: T = plans.run(None, retrying(lambda: plans.once(Do(call)), timeout_s))
    return result


async def retry_async(call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """``retry_sync`` of an awaitable call."""
    result: T = await plans.run_async(None, retrying(lambda: plans.once(Do(call)), timeout_s))
    return result


class ClusterClient(RedisCluster):
    """``redis.cluster.RedisCluster`` whose commands ride out a failover (see module doc)."""

    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().execute_command
        return retry_sync(lambda: parent(*args, **kwargs),  # type: ignore[no-untyped-call]
                          self.failover_timeout_s)


class AsyncClusterClient(AsyncRedisCluster):
    """``redis.asyncio.cluster.RedisCluster`` whose commands ride out a failover."""

    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().execute_command
        return await retry_async(lambda: parent(*args, **kwargs), self.failover_timeout_s)

    async def aclose(self) -> None:
        """Close the nodes' connections, and the plain per-node clients of durable writes."""
        for client in self.__dict__.pop("_inferq_nodes", {}).values():
            await client.aclose()
        await super().aclose()


def is_cluster_client(client: Any) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def failover_timeout(client: Any) -> float:
    return float(getattr(client, "failover_timeout_s", 0.0)) if is_cluster_client(client) else 0.0


#: One script call: the registered script object (for its source and sha), keys, args.
ScriptCall = tuple[Any, Sequence[Any], Sequence[Any]]


def script_round(calls: Sequence[ScriptCall], extra: Sequence[tuple[str, ...]] = (),
                 on: Any = None) -> Plan[list[Any]]:
    """Idempotent script calls in one pipelined round trip (per node on a cluster), in order,
    as plain EVALSHA (redis-py's pipelined script objects would first send SCRIPT EXISTS, a
    second round trip; and its cluster pipelines refuse ``evalsha``); ``extra`` commands
    follow in the same pipeline (their replies are appended, errors included, not raised).
    A server that lacks a script (a restart, SCRIPT FLUSH, a new master after a failover:
    SCRIPT LOAD is not replicated) gets it loaded, and only the refused calls run again, so
    nothing is written twice. ``on``: the client to use (default: the driver's)."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in (1, 2):
        commands = [call("execute_command", "EVALSHA", calls[i][0].sha, len(calls[i][1]),
                         *calls[i][1], *calls[i][2]) for i in todo]
        commands += [call("execute_command", *command) for command in extra]
        results = yield Pipeline(commands, raise_on_error=False, on=on)
        missing = _sort(todo, results[:len(todo)], replies, attempt)
        if not missing:
            return replies + list(results[len(todo):])
        for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
            script.sha = yield Direct(call("script_load", script.script), on=on)
        todo = missing
    raise AssertionError("unreachable")


def run_scripts(client: Any, calls: Sequence[ScriptCall], *,
                extra: Sequence[tuple[str, ...]] = ()) -> list[Any]:
    """``script_round`` on a sync client; a cluster in failover is retried
    (``failover_timeout``)."""
    return plans.run(client, retrying(lambda: script_round(calls, extra),
                                      failover_timeout(client)))


async def run_scripts_async(client: Any, calls: Sequence[ScriptCall], *,
                            extra: Sequence[tuple[str, ...]] = ()) -> list[Any]:
    """``run_scripts`` on an asyncio client."""
    replies: list[Any] = await plans.run_async(
        client, retrying(lambda: script_round(calls, extra), failover_timeout(client)))
    return replies


def _sort(todo: Sequence[int], results: Sequence[Any], replies: list[Any],
          attempt: int) -> list[int]:
    missing = []
    for i, result in zip(todo, results, strict=True):
        if isinstance(result, NoScriptError) and attempt == 1:
            missing.append(i)
        elif isinstance(result, Exception):
            if _moved([result]):
                raise _Moved(str(result)) from result
            raise result
        else:
            replies[i] = result
    return missing


# ------------------------------------------------------------------------ durability


def check_durability(level: str | None, timeout_s: float) -> None:
    if level is not None and level not in DURABILITY_LEVELS:
        raise ValidationError(f"durability must be None, 'fsync' or 'replica', got {level!r}")
    if not timeout_s > 0:
        raise ValidationError(f"durability_timeout_s must be > 0, got {timeout_s!r}")


def wait_command(level: str, timeout_s: float) -> tuple[str, ...]:
    """The command that, sent after the writes on the same connection, returns once they are
    durable: ``WAITAOF 1 0`` (this server's AOF fsynced) or ``WAIT 1`` (one replica has them)."""
    ms = str(max(1, round(timeout_s * 1000)))
    return ("WAITAOF", "1", "0", ms) if level == "fsync" else ("WAIT", "1", ms)


def check_ack(level: str, reply: Any, timeout_s: float, node: str) -> None:
    """Raise ``DurabilityError`` unless WAITAOF/WAIT confirmed the writes."""
    if isinstance(reply, Exception):
        raise durability_refused(level, reply, node) from reply
    if level == "fsync":
        local = int(reply[0])
        if local < 1:
            raise DurabilityError(
                f"the write reached Redis at {node} but its AOF fsync was not confirmed within "
                f"{timeout_s:g} s (appendfsync no never confirms; everysec within about a second); "
                "the request is queued, and enqueueing it again with the same "
                "id is safe", level=level)
        return
    if int(reply) < 1:
        raise DurabilityError(
            f"no replica of {node} acknowledged the write within {timeout_s:g} s (does the "
            "master have a connected replica?); the request is queued on the master, and "
            "enqueueing it again with the same id is safe", level=level)


def durability_refused(level: str, exc: Exception, node: str) -> DurabilityError:
    text = str(exc)
    if level == "fsync" and "unknown command" in text.lower():
        why = ("the server has no WAITAOF (Redis >= 7.2 or Valkey >= 7.2 needed for "
               "durability='fsync')")
    elif level == "fsync" and "appendonly" in text.lower():
        why = "the server's AOF is off (appendonly no): durability='fsync' needs appendonly yes"
    else:
        why = f"the server refused {wait_command(level, 1.0)[0]}"
    return DurabilityError(f"{why} at {node}: {text}", level=level)


def node_of(client: Any, key: str) -> tuple[Any, str]:
    """A plain client on the node that serves ``key`` (the client itself when not a cluster)
    and the node's name: WAITAOF/WAIT must follow the write on that node's connection."""
    if isinstance(client, RedisCluster):
        node: Any = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.get_redis_connection(node), str(node.name)
    if isinstance(client, AsyncRedisCluster):
        node = client.get_node_from_key(key)
        return _async_node_client(client, node), str(node.name)
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return client, f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _async_node_client(client: Any, node: Any) -> aioredis.Redis:
    """A plain asyncio client on one node of an asyncio cluster client (kept on it)."""
    clients: dict[str, aioredis.Redis] = client.__dict__.setdefault("_inferq_nodes", {})
    found = clients.get(node.name)
    if found is None:
        pool = aioredis.ConnectionPool(connection_class=node.connection_class,
                                       **node.connection_kwargs)
        found = clients[node.name] = aioredis.Redis(connection_pool=pool)
    return found


def _moved(results: Sequence[Any]) -> bool:
    """A reply that says the slot is served elsewhere now (MOVED/ASK, or a replica's
    READONLY after a failover): the slot map must be refreshed and the calls sent again."""
    return any(isinstance(r, AskError | ReadOnlyError) or (
        isinstance(r, ResponseError) and str(r).startswith(("MOVED", "ASK", "READONLY")))
        for r in results)


class _Moved(redis.ConnectionError):
    """Internal: a durable write met a moved slot; retried like a failover."""


def _by_node(client: Any, calls: Sequence[ScriptCall]) -> dict[str, tuple[Any, list[int]]]:
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, keys, _args) in enumerate(calls):
        node, name = node_of(client, str(keys[0]))
        groups.setdefault(name, (node, []))[1].append(i)
    return groups


def durable(client: Any, calls: Sequence[ScriptCall], level: str,
            timeout_s: float) -> Plan[list[Any]]:
    """``script_round`` per node, each node's calls followed on the same connection by
    WAITAOF/WAIT (``wait_command``); the replies once every node confirmed, else
    ``DurabilityError``. A slot that moved meanwhile sends the whole round again after the
    slot map is refreshed, for as long as a failover may last (at least a second)."""
    wait = wait_command(level, timeout_s)

    def once() -> Plan[list[Any]]:
        replies: list[Any] = [None] * len(calls)
        for name, (node, indices) in _by_node(client, calls).items():
            *results, ack = yield from script_round([calls[i] for i in indices], [wait],
                                                    on=node)
            if _moved(results):
                raise _Moved(f"slot moved away from {name}")
            check_ack(level, ack, timeout_s, name)
            for i, result in zip(indices, results, strict=True):
                replies[i] = result
        return replies

    def refresh() -> Plan[Any]:
        if is_cluster_client(client):
            yield Do(client.nodes_manager.initialize)

    return (yield from retrying(once, max(failover_timeout(client), 1.0), refresh))


def run_durable(client: Any, calls: Sequence[ScriptCall], level: str,
                timeout_s: float) -> list[Any]:
    """``durable`` on a sync client."""
    return plans.run(client, durable(client, calls, level, timeout_s))


async def run_durable_async(client: Any, calls: Sequence[ScriptCall], level: str,
                            timeout_s: float) -> list[Any]:
    """``durable`` on an asyncio client."""
    replies: list[Any] = await plans.run_async(client, durable(client, calls, level, timeout_s))
    return replies


__all__ = [
    "RETRYABLE",
    "AsyncClusterClient",
    "ClusterClient",
    "aioredis",
    "run_scripts",
    "run_scripts_async",
]
