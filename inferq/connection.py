"""How every part of inferq connects to Redis: one place for TLS, credentials and retries.

A ``ConnectionSettings`` holds the URL and what a URL cannot say (CA and client certificate
files, credential overrides, keepalive, health checks, retry policy). ``sync_client`` and
``async_client`` turn it into redis-py clients; the producer SDK, the worker, its heartbeat
thread and the CLI all go through them.

* ``redis://host:6379/0``: plain TCP. ``rediss://host:6380/0``: TLS, verified against the
  system CAs or ``ssl_ca_certs``; add ``ssl_certfile``/``ssl_keyfile`` when the server asks
  for a client certificate (``tls-auth-clients yes``).
* ``redis+sentinel://[[user]:password@]host1:26379,host2:26379/SERVICE[/DB]``: the master of
  a Redis Sentinel service, followed through failovers (``inferq.sentinel``).
* Credentials: ``redis://:password@host`` (``requirepass``) or ``redis://user:password@host``
  (an ACL user); percent-encode reserved characters. ``username``/``password`` override
  the URL's. Credentials are taken out of the URL before it reaches redis-py (where URL
  values would silently beat keyword arguments), and ``redact_url`` hides the password
  wherever a URL is shown.
* Environment (the CLI, the worker, the gateway and ``ConnectionSettings.from_env``):
  ``INFERQ_REDIS_URL`` (default ``redis://localhost:6379/0``), ``INFERQ_TLS_CA``,
  ``INFERQ_TLS_CERT``, ``INFERQ_TLS_KEY``.

Redis Cluster: point any of these at any node of a cluster with an ordinary URL. The first
client made for a ``ConnectionSettings`` asks the server ``INFO cluster``; where it says
``cluster_enabled:1``, ``sync_client``/``async_client`` return cluster clients
(``inferq.cluster.ClusterClient``/``AsyncClusterClient``) with the same TLS files, credentials
and timeouts, which follow MOVED/ASK and ride out a failover for ``failover_timeout_s``.
``cluster=True``/``False`` skips the question. A server that cannot be reached at that moment
is taken as a single Redis (the question is asked again by the next client).

Every connection has a connect timeout (5 s) and a read timeout (10 s, ``socket_timeout``;
``INFERQ_REDIS_TIMEOUT_S``); blocking reads block for at most ``MAX_BLOCK_S`` per call. A URL
with a bad port or database is a ``ConfigError`` at once; a peer that is not a Redis server
(protocol error) or does not answer is a one-line ``BackendUnavailable`` naming the server.

Connection errors are retried with jittered exponential backoff (a read timeout is not: it
has already waited ``socket_timeout``). Every script
inferq runs is safe to repeat (enqueue is idempotent on the request id, completion is
token-checked and first-writer-wins); a claim repeated after a lost reply leaves leases that
nobody heartbeats, which the reclaim sweep returns to the queue when they expire. When the
retries are spent, the SDK raises ``BackendUnavailable`` (``wrap_connection_errors``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, unquote_plus

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    ClusterDownError,
    InvalidResponse,
    MasterDownError,
    NoPermissionError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from inferq import sentinel
from inferq.errors import BackendUnavailable, ConfigError
from inferq.protocol.keys import DEFAULT_NAMESPACE

DEFAULT_URL = "redis://localhost:6379/0"
URL_ENV = "INFERQ_REDIS_URL"
TLS_CA_ENV = "INFERQ_TLS_CA"
TLS_CERT_ENV = "INFERQ_TLS_CERT"
TLS_KEY_ENV = "INFERQ_TLS_KEY"
TIMEOUT_ENV = "INFERQ_REDIS_TIMEOUT_S"

CertReqs = Literal["required", "optional", "none"]
SCHEMES = ("redis", "rediss", "unix", sentinel.SCHEME)
REDACTED = "***"

#: A cluster that still has no master for a slot once ``failover_timeout_s`` has passed.
CLUSTER_UNAVAILABLE = (ClusterDownError, MasterDownError, TryAgainError, SlotNotCoveredError)

#: Query arguments whose value is a secret (redis-py reads ``password``; the others are what
#: other clients and proxies call theirs).
#: A secret's value runs to the next ``&``: a raw ``#`` in it is part of it, not a fragment.
_QUERY_SECRET = re.compile(r"([?&](?:password|pass|passwd|auth|token|sentinel_password)=)[^&]+",
                           re.IGNORECASE)

#: The longest a single blocking read (BLMOVE, BLPOP, XREAD BLOCK) may block in Redis. Longer
#: waits are sliced into calls of at most this (and at most half the socket read timeout,
#: ``ConnectionSettings.socket_timeout``), so every call returns well inside the read timeout
#: and a hung server is detected.
MAX_BLOCK_S = 5.0
#: The shortest read timeout allowed: the worker's wake-ups and the async client's result
#: inbox block for 1 s per call.
MIN_READ_TIMEOUT_S = 2.0


#: Every command the SDK, the worker and ``inferq stats`` send, including the ones inferq's Lua
#: scripts call (Redis checks those against the caller's ACL too). ``acl_rules`` turns it into
#: a least-privilege ACL user. CONFIG GET is left out on purpose: it would reveal
#: ``requirepass``; the worker then skips its persistence/eviction check.
ACL_COMMANDS: tuple[str, ...] = (
    # scripts: EVALSHA; redis-py loads a missing one with SCRIPT LOAD (pipelines: SCRIPT EXISTS)
    "evalsha", "script|load", "script|exists",
    # called inside the scripts
    "time", "exists", "del", "incr", "incrby", "pexpire",
    "hget", "hmget", "hset", "hdel", "hincrby", "sismember", "srem",
    "rpush", "ltrim", "llen",
    "zadd", "zrem", "zcard", "zrange", "zrangebyscore", "zpopmin", "zremrangebyscore",
    "zremrangebyrank", "xadd",
    # producers: results (BLMOVE, LINDEX), the async client's inbox (BLMPOP), status (HGET),
    # generation streams (XREAD)
    "blmove", "blmpop", "lindex", "xread",
    # workers: wake-ups (BLPOP), queue registry (SADD), tuning and window stats, heartbeat;
    # each names its connections after itself (CLIENT SETNAME), and the reclaim sweep lists
    # the connected ones (CLIENT LIST) to notice a dead worker; INFO (below) gives the sweep
    # the server's run_id
    "blpop", "sadd", "expire", "client|setname", "client|list",
    # inferq stats
    "smembers", "hgetall", "zcount",
    # dead letters (requeue, purge, inferq request), the autoscaling signal (GET of the
    # enqueue counter)
    "zscore", "get",
    # connection health checks; SELECT only for a database other than 0
    "ping", "select",
    # cluster mode: the detection (INFO cluster), redis-py's slot map (CLUSTER SLOTS) and
    # its command table (COMMAND, read once to find each command's keys)
    "info", "cluster|slots", "command",
    # ClientOptions(durability="replica"): WAIT after enqueue. durability="fsync" needs
    # +waitaof too, which servers before 7.2 do not know (ACL SETUSER refuses it there)
    "wait",
    # the gateway's batch jobs (files, batches, their runner): indexes, the wake list, a
    # batch's inbox, the metadata transactions
    "lrange", "lpush", "zrank", "zrevrank", "multi", "exec",
    # the gateway's stream reader (``inferq.gateway.streams``): its connection's id, the
    # wake-up of its blocked XREAD when a stream opens, and a resume position's check
    "client|id", "client|unblock", "xrevrange",
    # tenant keys and dashboard sessions (``inferq.tenancy``): create/revoke and the failed
    # sign-in counter are small EVAL scripts; a gateway is open while HLEN of the key index is 0
    "eval", "hlen",
    # billable usage (``lua/includes/usage.lua``): each hour's hash expires at a fixed time
    "pexpireat",
    # cache affinity (``lua/includes/affinity.lua``): a claim reads workers' held sets and
    # notes when it passed a request over
    "smismember", "hsetnx",
)


def acl_rules(namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """ACL SETUSER rules (after ``on`` and ``>password``) for a user that can run everything
    inferq does on one namespace and nothing else: no other keys, channels or commands."""
    return ["resetkeys", f"~{namespace}:*", "resetchannels", "-@all",
            *(f"+{command}" for command in ACL_COMMANDS)]


def _split(url: str) -> tuple[str, str | None, str, str]:
    """``scheme://``, userinfo (None without ``@``), host[:port], rest: the pieces ``urlsplit``
    finds, kept verbatim so a URL can be put back together byte for byte."""
    scheme, sep, rest = url.partition("://")
    head = scheme + sep if sep else ""
    if not sep:
        rest = url
    end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hostport = netloc.rpartition("@")
    return head, (userinfo if at else None), hostport, tail


def redact_url(url: str) -> str:
    """The URL with every part that may be a secret replaced by ``***``, everything else
    unchanged, byte for byte: the one redaction of every component (SDK, worker, CLI,
    gateway). For logs and error messages: never show a URL without it.

    The rule leans to the safe side: after ``user:`` whatever follows (even nothing) is
    masked; a userinfo without a colon is masked whole (``redis://pw@host``: some clients take
    a lone userinfo for the password); and the values of the query arguments ``password``
    (which redis-py also accepts), ``pass``, ``passwd``, ``auth`` and ``token``, up to the
    next ``&``.

    The userinfo ends at the *last* ``@`` before any secret query argument, not at the first
    ``/``, ``?`` or ``#`` as a URL parser reads it: a password written without
    percent-encoding (``redis://:pa#ss@host``, ``redis://:p/w?x@host``) is a URL that redis-py
    misreads, and exactly the one that ends up in an error message, so it is masked whole.
    The price: an ``@`` in a path or a non-secret query value masks everything before it.
    """
    scheme, sep, rest = url.partition("://")
    head = scheme + sep if sep else ""
    if not sep:
        rest = url
    secret = _QUERY_SECRET.search(rest)
    at = rest.rfind("@", 0, secret.start() if secret is not None else len(rest))
    if at != -1:
        user, colon, _ = rest[:at].partition(":")
        head += f"{user}:{REDACTED}@" if colon else f"{REDACTED}@"
        rest = rest[at + 1:]
    return head + _QUERY_SECRET.sub(rf"\g<1>{REDACTED}", rest)


def _credentials(url: str) -> tuple[str, str | None, str | None]:
    """The URL without credentials (userinfo, ``username=``/``password=`` query arguments),
    and the username and password it carried, percent-decoded."""
    head, userinfo, hostport, tail = _split(url)
    username = password = None
    if userinfo is not None:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon and secret else None
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        kept = []
        for arg in query.split("&"):
            name, _, value = arg.partition("=")
            if name == "username" and value:  # decoded as redis-py's parse_qs does
                username = unquote_plus(value)
            elif name == "password" and value:
                password = unquote_plus(value)
            elif arg:
                kept.append(arg)
        tail = path + ("?" + "&".join(kept) if kept else "") + hash_ + fragment
    return head + hostport + tail, username, password


def _env(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name) or None


def url_from_env(url: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``url`` if given, else ``$INFERQ_REDIS_URL``, else ``redis://localhost:6379/0``."""
    return url or _env(os.environ if environ is None else environ, URL_ENV) or DEFAULT_URL


@dataclass(frozen=True, slots=True, repr=False)
class ConnectionSettings:
    """Where and how to connect. Validated at construction; every check names the bad value."""

    url: str = DEFAULT_URL
    #: PEM bundle of the CA(s) that signed the server certificate (``rediss://`` only);
    #: None verifies against the system's default CAs.
    ssl_ca_certs: str | None = None
    #: Client certificate (PEM, may include the key) for servers with ``tls-auth-clients``.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: ``required`` verifies the server certificate and host name; ``none`` turns both off
    #: (only for testing: it allows a man in the middle).
    ssl_cert_reqs: CertReqs = "required"
    #: Override the URL's username / password (e.g. from a secret store).
    username: str | None = None
    password: str | None = None
    socket_keepalive: bool = True
    socket_connect_timeout: float | None = 5.0
    #: Read timeout of every command: a server that accepts connections but never answers
    #: fails with ``BackendUnavailable`` instead of hanging. Blocking reads stay below it
    #: (sliced into calls of at most ``MAX_BLOCK_S`` and half of this).
    socket_timeout: float | None = 10.0
    #: PING a connection idle for this many seconds before reusing it (0 = never).
    health_check_interval: float = 30.0
    #: Retries of a command after a ConnectionError/TimeoutError (0 = none), with jittered
    #: exponential backoff from ``retry_backoff_base_s`` up to ``retry_backoff_cap_s``.
    retries: int = 3
    retry_backoff_base_s: float = 0.05
    retry_backoff_cap_s: float = 2.0
    #: Redis Cluster mode: None asks the server (``INFO cluster``), True/False force it.
    cluster: bool | None = None
    #: On a cluster, how long a command keeps being retried through a failover or resharding
    #: (connection errors, CLUSTERDOWN, TRYAGAIN, MASTERDOWN) before the error is raised.
    failover_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        shown = redact_url(self.url)
        scheme = self.url.partition("://")[0] if "://" in self.url else ""
        if scheme not in SCHEMES:
            raise ConfigError("url must start with redis://, rediss://, unix:// or "
                              f"redis+sentinel://, got {shown!r}")
        if scheme == sentinel.SCHEME:
            sentinel.parse(self.url, shown)
            if self.cluster:
                raise ConfigError(f"a Sentinel service is not a Redis Cluster: {shown!r}")
        else:
            _check_address(self.url, scheme, shown)
        if self.ssl_cert_reqs not in ("required", "optional", "none"):
            raise ConfigError("ssl_cert_reqs must be required, optional or none, got "
                              f"{self.ssl_cert_reqs!r}")
        if self.ssl_cert_reqs != "required" and scheme != "rediss":
            raise ConfigError(f"ssl_cert_reqs={self.ssl_cert_reqs!r} needs a rediss:// URL "
                              f"(TLS), got {shown!r}")
        tls_files = {"ssl_ca_certs": self.ssl_ca_certs, "ssl_certfile": self.ssl_certfile,
                     "ssl_keyfile": self.ssl_keyfile}
        for name, path in tls_files.items():
            if path is None:
                continue
            if scheme != "rediss":
                raise ConfigError(f"{name}={path!r} needs a rediss:// URL (TLS), got {shown!r}")
            if not Path(path).is_file():
                raise ConfigError(f"{name} must be a readable file, got {path!r}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError(f"ssl_keyfile={self.ssl_keyfile!r} needs ssl_certfile "
                              "(the client certificate it belongs to)")
        if self.socket_connect_timeout is not None and not self.socket_connect_timeout > 0:
            raise ConfigError("socket_connect_timeout must be > 0 or None, got "
                              f"{self.socket_connect_timeout!r}")
        if self.socket_timeout is not None and not self.socket_timeout >= MIN_READ_TIMEOUT_S:
            raise ConfigError(f"socket_timeout must be >= {MIN_READ_TIMEOUT_S} s (blocking reads "
                              f"of up to 1 s must fit in it) or None, got {self.socket_timeout!r}")
        if self.health_check_interval < 0:
            raise ConfigError("health_check_interval must be >= 0, got "
                              f"{self.health_check_interval!r}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries!r}")
        if not 0 < self.retry_backoff_base_s <= self.retry_backoff_cap_s:
            raise ConfigError("retry_backoff_base_s must be > 0 and <= retry_backoff_cap_s, got "
                              f"{self.retry_backoff_base_s!r} (cap {self.retry_backoff_cap_s!r})")

        if not self.failover_timeout_s >= 0:
            raise ConfigError(f"failover_timeout_s must be >= 0, got {self.failover_timeout_s!r}")

    @classmethod
    def from_env(cls, url: str | None = None, *, environ: Mapping[str, str] | None = None,
                 **fields: Any) -> ConnectionSettings:
        """Settings from ``INFERQ_REDIS_URL`` and ``INFERQ_TLS_CA/CERT/KEY``; arguments that are
        given (not None) win over the environment."""
        env = os.environ if environ is None else environ
        given = {k: v for k, v in fields.items() if v is not None}
        if (timeout := _env(env, TIMEOUT_ENV)) is not None and "socket_timeout" not in given:
            try:
                given["socket_timeout"] = float(timeout)
            except ValueError:
                raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds, got "
                                  f"{timeout!r}") from None
        return cls(
            url=url_from_env(url, env),
            **{
                "ssl_ca_certs": _env(env, TLS_CA_ENV),
                "ssl_certfile": _env(env, TLS_CERT_ENV),
                "ssl_keyfile": _env(env, TLS_KEY_ENV),
                **given,
            },
        )

    @property
    def tls(self) -> bool:
        return self.url.startswith("rediss://")

    @property
    def redacted_url(self) -> str:
        return redact_url(self.url)

    def __repr__(self) -> str:
        tls = (f", ssl_ca_certs={self.ssl_ca_certs!r}, ssl_certfile={self.ssl_certfile!r}, "
               f"ssl_cert_reqs={self.ssl_cert_reqs!r}") if self.tls else ""
        user = f", username={self.username!r}" if self.username is not None else ""
        password = f", password={REDACTED!r}" if self.password is not None else ""
        return f"ConnectionSettings(url={self.redacted_url!r}{tls}{user}{password})"

    def _kwargs(self) -> tuple[str, dict[str, Any]]:
        """The URL without credentials, and keyword arguments for ``from_url``."""
        url, username, password = _credentials(self.url)
        kwargs: dict[str, Any] = {
            "socket_keepalive": self.socket_keepalive,
            "socket_connect_timeout": self.socket_connect_timeout,
            "socket_timeout": self.socket_timeout,
            "health_check_interval": self.health_check_interval,
        }
        username = self.username if self.username is not None else username
        password = self.password if self.password is not None else password
        if username is not None:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password
        if self.tls:
            kwargs.update(
                ssl_ca_certs=self.ssl_ca_certs,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_cert_reqs=self.ssl_cert_reqs,
                # host names are checked whenever certificates are (ssl refuses the mix).
                ssl_check_hostname=self.ssl_cert_reqs != "none",
            )
        return url, kwargs

    @property
    def sentinel(self) -> bool:
        """A ``redis+sentinel://`` URL: clients of the service's master (``inferq.sentinel``)."""
        return self.url.startswith(sentinel.SCHEME + "://")

    def _sentinel_retries(self) -> int:
        """Retries that span ``failover_timeout_s`` (a promotion takes seconds)."""
        return sentinel.retries_for(self.failover_timeout_s, self.retry_backoff_cap_s,
                                    self.retries)

    def _backoff(self) -> ExponentialWithJitterBackoff:
        return ExponentialWithJitterBackoff(cap=self.retry_backoff_cap_s,
                                            base=self.retry_backoff_base_s)


def _check_address(url: str, scheme: str, shown: str) -> None:
    """The port is a number in 1..65535 and the database a number (redis-py would raise a bare
    ``ValueError`` later, at the first command)."""
    if scheme == "unix":
        return
    _, _, hostport, tail = _split(url)
    host, colon, port = hostport.rpartition(":") if not hostport.endswith("]") else (
        hostport, "", "")
    if colon and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"invalid port {port!r} in Redis URL {shown!r} "
                          "(expected redis://host:PORT/DB, PORT a number)")
    if colon and not host:
        raise ConfigError(f"no host in Redis URL {shown!r}")
    db = tail.partition("?")[0].partition("#")[0].strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"invalid database {db!r} in Redis URL {shown!r} "
                          "(expected redis://host:port/DB, DB a number)")


Settings = ConnectionSettings | str | None
#: Errors worth retrying: a dropped or refused connection. Not a read timeout (it already
#: waited ``socket_timeout``; retrying would multiply a hung server's wait).
RETRIED: tuple[type[redis.RedisError], ...] = (redis.ConnectionError,)


def resolve(settings: Settings) -> ConnectionSettings:
    """A ``ConnectionSettings`` as given, or one from a URL (or None) plus the environment."""
    if isinstance(settings, ConnectionSettings):
        return settings
    return ConnectionSettings.from_env(settings)


_CLUSTER_MODE: dict[ConnectionSettings, bool] = {}


def is_cluster(settings: Settings = None) -> bool:
    """Whether the server is a Redis Cluster node (``INFO cluster``), asked once per settings.

    ``cluster=True/False`` in the settings answers without asking; a unix socket is never a
    cluster. A server that cannot be reached, or an ACL user without INFO, counts as a single
    Redis and is not remembered.
    """
    s = resolve(settings)
    if s.cluster is not None:
        return s.cluster
    if s.url.startswith("unix://") or s.sentinel:
        return False
    known = _CLUSTER_MODE.get(s)
    if known is not None:
        return known
    url, kwargs = s._kwargs()
    # asked on database 0: a cluster node may refuse any other (sync_client then says so)
    head, _, rest = url.partition("://")
    hostport, _, tail = rest.partition("/")
    query = tail.partition("?")[1] + tail.partition("?")[2]
    probe = redis.Redis.from_url(f"{head}://{hostport}/0{query}",
                                 **{**kwargs, "socket_timeout": 5.0,
                                    "retry": Retry(s._backoff(), 0)})
    try:
        enabled = int(probe.info("cluster").get("cluster_enabled", 0)) == 1
    except (redis.ConnectionError, redis.TimeoutError, NoPermissionError, InvalidResponse):
        return False  # not a (reachable) Redis: the client made next says so in one line
    except redis.ResponseError:  # a proxy or a server without INFO sections
        enabled = False
    finally:
        probe.close()
    _CLUSTER_MODE[s] = enabled
    return enabled


def _cluster_url(s: ConnectionSettings, url: str) -> str:
    """The URL for redis-py's cluster client: without a database (a cluster has only 0)."""
    head, _, rest = url.partition("://")
    hostport, _, tail = rest.partition("/")
    db, q, query = tail.partition("?")
    if db not in ("", "0"):
        raise ConfigError(f"a Redis Cluster has only database 0, got {s.redacted_url!r}")
    return f"{head}://{hostport}/" + (q + query if q else "")


def sync_client(settings: Settings = None, **overrides: Any) -> Any:
    """A ``redis.Redis`` for these settings, or an ``inferq.cluster.ClusterClient`` when the
    server is a Redis Cluster node; ``overrides`` are redis-py keyword arguments (e.g.
    ``socket_timeout``) and win over the settings."""
    s = resolve(settings)
    url, kwargs = s._kwargs()
    if s.sentinel:
        kwargs["retry"] = Retry(s._backoff(), s._sentinel_retries(),
                                supported_errors=sentinel.RETRIED)
        return sentinel.sync_client(url, s.redacted_url, {**kwargs, **overrides})
    kwargs["retry"] = Retry(s._backoff(), s.retries, supported_errors=RETRIED)
    if is_cluster(s):
        from inferq.cluster import ClusterClient

        client: Any = ClusterClient.from_url(_cluster_url(s, url), **{**kwargs, **overrides})
        client.failover_timeout_s = s.failover_timeout_s
        return client
    return redis.Redis.from_url(url, **{**kwargs, **overrides})


def async_client(settings: Settings = None, *, max_connections: int | None = None,
                 blocking_pool: bool = False, **overrides: Any) -> Any:
    """A ``redis.asyncio.Redis`` for these settings.

    ``blocking_pool`` uses a ``BlockingConnectionPool`` of ``max_connections``: calls beyond
    that wait (without a time limit) for a free connection instead of failing.
    """
    s = resolve(settings)
    url, kwargs = s._kwargs()
    if s.sentinel:
        # No blocking pool (redis-py's sentinel pool is not one): a generous bound instead.
        kwargs["retry"] = AsyncRetry(s._backoff(), s._sentinel_retries(),
                                     supported_errors=sentinel.RETRIED)
        kwargs.update(overrides)
        if max_connections is not None:
            kwargs["max_connections"] = max(max_connections, 1024)
        return sentinel.async_client(url, s.redacted_url, kwargs)
    kwargs["retry"] = AsyncRetry(s._backoff(), s.retries, supported_errors=RETRIED)
    kwargs.update(overrides)
    if is_cluster(s):
        # One pool per node, created as needed; redis-py's cluster nodes have no blocking
        # pool, so ``max_connections`` bounds each node's pool from above only loosely.
        from inferq.cluster import AsyncClusterClient

        if max_connections is not None:
            kwargs["max_connections"] = max(max_connections, 1024)
        client: Any = AsyncClusterClient.from_url(_cluster_url(s, url), **kwargs)
        client.failover_timeout_s = s.failover_timeout_s
        return client
    if blocking_pool:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections or 50, timeout=None, **kwargs)
        return aioredis.Redis(connection_pool=pool)
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    return aioredis.Redis.from_url(url, **kwargs)


def describe_error(settings: ConnectionSettings | str, exc: BaseException) -> str:
    """A one-line explanation of a failure to talk to the server, naming the redacted URL."""
    url = settings.url if isinstance(settings, ConnectionSettings) else settings
    text = str(exc)
    if isinstance(exc, redis.AuthenticationError | AuthenticationWrongNumberOfArgsError):
        hint = "authentication failed (wrong or missing username/password?)"
    elif isinstance(exc, NoPermissionError):
        hint = "the ACL user lacks a permission inferq needs"
    elif isinstance(exc, redis.ConnectionError) and re.search(
            r"ssl|certificate|EOF occurred", text, re.IGNORECASE):
        hint = ("TLS handshake failed (server certificate not signed by --tls-ca, or the "
                "server wants a client certificate: --tls-cert/--tls-key)")
    elif isinstance(exc, InvalidResponse):
        hint = "not a Redis server (protocol error; wrong port?)"
    elif isinstance(exc, redis.ConnectionError):
        hint = "cannot connect"
    elif isinstance(exc, redis.TimeoutError):
        hint = "no reply (timed out; is it a Redis server, and is it up?)"
    elif isinstance(exc, CLUSTER_UNAVAILABLE):
        hint = "the Redis Cluster has no master for the slot (failover or resharding)"
    elif isinstance(exc, RedisClusterException):
        hint = "cannot connect to any node of the Redis Cluster"
    else:
        hint = "Redis error"
    # Neither redis-py nor the server echo passwords today; scrub anyway, defensively.
    secrets = [_credentials(url)[2]]
    if isinstance(settings, ConnectionSettings):
        secrets.append(settings.password)
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return f"{hint} at {redact_url(url)}: {text}"


@contextlib.contextmanager
def wrap_connection_errors(settings: ConnectionSettings) -> Iterator[None]:
    """Re-raise redis-py's connection and timeout errors as ``BackendUnavailable`` naming the
    (redacted) server; authentication errors keep their own type."""
    try:
        yield
    except (redis.AuthenticationError, BackendUnavailable):
        raise
    except (redis.ConnectionError, redis.TimeoutError, InvalidResponse,
            *CLUSTER_UNAVAILABLE) as exc:
        raise BackendUnavailable(describe_error(settings, exc),
                                 url=settings.redacted_url) from exc
    except RedisClusterException as exc:  # no node of the cluster answers
        if "cannot be connected" not in str(exc):
            raise
        raise BackendUnavailable(describe_error(settings, exc),
                                 url=settings.redacted_url) from exc
