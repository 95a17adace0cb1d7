"""Redis Sentinel: ``redis+sentinel://`` URLs, as redis-py's ``Sentinel``, Celery and Kombu
name the same things (the sentinels, the service name, a database, a password):

    redis+sentinel://[[user]:password@]host1:26379,host2:26379,host3:26379/SERVICE[/DB]

The password (and user) are the data nodes' (master and replicas); sentinels that require a
password of their own take ``?sentinel_password=...`` (never shown: ``redact_url`` hides it).
A client asks the sentinels for the service's master at each new connection
(``SentinelConnectionPool``); a connection to a master that was demoted fails (READONLY,
refused, reset), and the command is retried on a new connection to the promoted replica for
as long as ``failover_timeout_s``. ``connection.sync_client``/``async_client`` build these
clients from any ``redis+sentinel://`` URL, so producers, workers, the gateway and the CLI all
follow a failover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from inferq.errors import ConfigError

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_password: str | None


def parse(url: str, shown: str) -> SentinelTarget:
    """The parts of a ``redis+sentinel://`` URL; a ``ConfigError`` naming ``shown`` (the
    redacted URL) when one is missing or malformed."""
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":") if ":" in item else (item, "", "")
        if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ConfigError(f"invalid sentinel {item!r} in {shown!r} (expected "
                              "redis+sentinel://host:port,host:port/SERVICE/DB)")
        sentinels.append((host.strip("[]"), int(port) if colon else DEFAULT_PORT))
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigError(f"no service name in {shown!r} (expected "
                          "redis+sentinel://host:port,host:port/SERVICE/DB)")
    if len(parts) == 2 and not parts[1].isdigit():
        raise ConfigError(f"invalid database {parts[1]!r} in {shown!r}")
    options = dict(parse_qsl(query))
    unknown = set(options) - {"sentinel_password"}
    if unknown:
        raise ConfigError(f"unknown option(s) {sorted(unknown)} in {shown!r} (known: "
                          "sentinel_password)")
    return SentinelTarget(tuple(sentinels), unquote(parts[0]),
                          int(parts[1]) if len(parts) == 2 else 0, username, password,
                          options.get("sentinel_password"))


#: Errors retried on a new connection (to whichever master the sentinels name then).
RETRIED: tuple[type[redis.RedisError], ...] = (redis.ConnectionError, redis.TimeoutError)


def retries_for(failover_timeout_s: float, cap_s: float, least: int) -> int:
    """Enough retries (each after a backoff of up to ``cap_s``, half of it on average) to
    span a failover of ``failover_timeout_s``."""
    return max(least, math.ceil(failover_timeout_s / max(cap_s / 2, 0.05)))


def _split_kwargs(target: SentinelTarget, kwargs: dict[str, Any]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data nodes' keyword arguments and the sentinels' own."""
    data = dict(kwargs)
    data["db"] = target.db
    if target.username is not None and "username" not in data:
        data["username"] = target.username
    if target.password is not None and "password" not in data:
        data["password"] = target.password
    sentinel_kwargs = {k: v for k, v in data.items() if k.startswith("socket_")}
    if target.sentinel_password is not None:
        sentinel_kwargs["password"] = target.sentinel_password
    return data, sentinel_kwargs


def sync_client(url: str, shown: str, kwargs: dict[str, Any]) -> redis.Redis:
    """A client of the service's master, following failovers (``kwargs``: the data nodes',
    their retry policy included)."""
    target = parse(url, shown)
    data, sentinel_kwargs = _split_kwargs(target, kwargs)
    manager = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    client: redis.Redis = manager.master_for(target.service, **data)
    return client


def async_client(url: str, shown: str, kwargs: dict[str, Any]) -> Any:
    """An asyncio client of the service's master, following failovers."""
    target = parse(url, shown)
    data, sentinel_kwargs = _split_kwargs(target, kwargs)
    manager = AsyncSentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return manager.master_for(target.service, **data)
