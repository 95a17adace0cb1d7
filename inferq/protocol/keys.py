"""Every Redis key name inferq uses, in one place.

All keys of one queue *shard* share one hash tag, so each Lua script touches a single cluster
slot. Shard 0 keeps the original layout, tag ``{task:model}``; shard k > 0 of a queue split into
S shards uses ``{task:model#k}``, so the shards hash to different slots and can sit on different
Redis Cluster masters. No script touches two shards: a worker calls each script once per shard.

Every script declares in KEYS the shard-wide keys it touches (``pending``, ``inflight``,
``started``, ``leases``, ``delayed``, ``dead``, ``dead_letters``, ``wake``, ``stats``,
``seq``, ``workers``, ``conns``); the first
declared key always names the shard's slot. Per-request keys (``req:<id>``, ``result:<id>``,
``stream:<id>``, ``inbox:<client>``, ``cancels:<worker>``) are built inside the scripts from the
``prefix`` argument, because a script learns which ids it acts on only while it runs (the head
of ``pending``, the expired members of ``inflight``); so is the usage hash of the current hour
(``usage:<hour>``, and ``usage:total``), whose hour only the script's clock (Redis ``TIME``)
knows. They are not declared, and need not be:
Redis Cluster hashes only the text between the first ``{`` and the next ``}``, and every such
key is ``prefix`` + a suffix, with ``prefix`` ending in ``{<tag>}:``, so it hashes to exactly
the slot of the declared keys (built from the same ``prefix``). Ids and client names cannot
change this: they come after the tag.

Queue-level settings (the shard count, depth limits) live in one hash, ``config``, on shard 0.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from inferq.errors import ValidationError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_NAMESPACE = "inferq"
#: The suffixes of per-request keys after ``prefix`` (``req:<id>``, ...): the one source for
#: the methods below and for the Lua scripts (where they are ``K_REQ``, ``K_RESULT``, ...).
PER_REQUEST = {"req": "req:", "result": "result:", "stream": "stream:", "inbox": "inbox:",
               "cancels": "cancels:", "held": "held:"}
_REQ, _RESULT, _STREAM, _INBOX, _CANCELS, _HELD = PER_REQUEST.values()

#: The field prefix, in a shard's stats hash, of a tenant's count of unfinished requests
#: (``lua/includes/tenants.lua``).
TENANT_COUNT = "tenant:"
#: The field prefix, in a shard's stats hash, of a priority band's estimated tokens pending
#: (``qtok:<100 - priority>``; ``lua/includes/queued.lua``).
QUEUED_TOKENS = "qtok:"

#: The key suffix of a shard's usage hashes (``QueueKeys.usage``, ``usage_total``), their
#: counters (per tenant: requests without a tenant are not counted) and how long an hour's
#: counts are kept.
USAGE = "usage:"
USAGE_COUNTERS = ("requests", "prompt_tokens", "completion_tokens")
USAGE_RETENTION_MS = 400 * 24 * 3_600_000

#: Registry of queue names (a plain set, outside any queue's slot) for ``inferq stats``.
def queues_registry(namespace: str = DEFAULT_NAMESPACE) -> str:
    """Set of the queues (``task:model``) some worker has served (each adds its own)."""
    return f"{namespace}:queues"


def requested_registry(namespace: str = DEFAULT_NAMESPACE) -> str:
    """Set of the queues producers have enqueued to (``inferq stats`` lists them too, so a
    queue with requests and no worker shows)."""
    return f"{namespace}:queues:requested"


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValidationError(
            f"{kind} must match {NAME_RE.pattern} (letters, digits, '.', '_', '-'), got {value!r}"
        )
    return value


def check_tenant(tenant: object) -> str:
    """A tenant name, validated like a queue's names (letters, digits, ``._-``): the one check
    of a tenant's name (fair shares, keys, settings)."""
    if not isinstance(tenant, str):
        raise ValidationError(f"tenant must be a str, got {type(tenant).__name__}",
                              field="tenant")
    try:
        return check_name("tenant", tenant)
    except ValidationError as exc:
        raise ValidationError(exc.message, field="tenant") from exc


def queue_name(task: str, model: str) -> str:
    return f"{check_name('task', task)}:{check_name('model', model)}"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Key names of one queue (one task on one model)."""

    queue: str
    namespace: str = DEFAULT_NAMESPACE
    #: Which shard of the queue these keys belong to (0 = the original, unsharded layout).
    shard: int = 0

    @classmethod
    def for_model(cls, task: str, model: str, namespace: str = DEFAULT_NAMESPACE) -> QueueKeys:
        return cls(queue_name(task, model), namespace)

    def for_shard(self, shard: int) -> QueueKeys:
        return QueueKeys(self.queue, self.namespace, shard)

    def shards(self, count: int) -> list[QueueKeys]:
        """The keys of shards 0..count-1 of this queue."""
        return [self.for_shard(k) for k in range(max(1, count))]

    @property
    def tag(self) -> str:
        return self.queue if self.shard == 0 else f"{self.queue}#{self.shard}"

    @property
    def prefix(self) -> str:
        """``inferq:{task:model}:`` (shard k: ``inferq:{task:model#k}:``) — scripts append
        ``req:<id>`` and ``result:<id>``."""
        return f"{self.namespace}:{{{self.tag}}}:"

    @property
    def config(self) -> str:
        """Hash of queue-level settings (``shards``, depth limits), always on shard 0."""
        return f"{self.namespace}:{{{self.queue}}}:config"

    @property
    def pending(self) -> str:
        return self.prefix + "pending"

    @property
    def inflight(self) -> str:
        return self.prefix + "inflight"

    @property
    def started(self) -> str:
        """Set of in-flight ids whose current claim has started running (the START script):
        an expired lease counts an attempt only for these."""
        return self.prefix + "started"

    @property
    def leases(self) -> str:
        """Hash: in-flight id -> the lease token of its current claim (``owner/attempt/time``),
        the proof that no result exists yet. Every script that checks a lease reads it here,
        one HMGET for a whole window; a lease ends (HDEL) wherever the id leaves ``inflight``."""
        return self.prefix + "leases"

    @property
    def seq(self) -> str:
        return self.prefix + "seq"

    @property
    def fair(self) -> str:
        """Hash of the shard's fair-share clocks (``inferq.protocol.fair``): per band its epoch and
        latest virtual finish time, per band and tenant the tenant's last finish time."""
        return self.prefix + "fair"

    @property
    def wake(self) -> str:
        """List of wake-up tokens: enqueue pushes, idle workers block on it (BLPOP)."""
        return self.prefix + "wake"

    @property
    def delayed(self) -> str:
        """Sorted set: id -> time (ms) its retry backoff ends; claim promotes due ones."""
        return self.prefix + "delayed"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def dead_letters(self) -> str:
        """Hash: dead-lettered id -> msgpack record of the request as it died (its hash's
        fields, error code and message, attempts, time), for showing and requeueing it."""
        return self.prefix + "deadrec"

    @property
    def workers(self) -> str:
        """Sorted set: worker id -> liveness deadline (ms, Redis clock)."""
        return self.prefix + "workers"

    @property
    def conns(self) -> str:
        """Hash: registered worker id -> ``up`` (a reclaim sweep saw one of its named
        connections) or ``<ms> <registry score>`` (first seen without any): how a dead worker
        is noticed by its closed connections (``lua/reclaim.lua``)."""
        return self.prefix + "conns"

    @property
    def stats(self) -> str:
        """Hash of counters (completed, failed, dead, reclaimed, ...)."""
        return self.prefix + "stats"

    @property
    def throughput(self) -> str:
        """Hash: unix second -> completed count, trimmed to recent seconds."""
        return self.prefix + "tput"

    def usage(self, hour: int) -> str:
        """Hash of billable usage in one hour (``hour`` = unix ms // 3,600,000): field
        ``<tenant>|<counter>`` (``USAGE_COUNTERS``), written by the complete script with each
        final result, expiring ``USAGE_RETENTION_MS`` after its hour."""
        return f"{self.prefix}{USAGE}{hour}"

    @property
    def usage_total(self) -> str:
        """Hash: the shard's billable usage since it was created, fields as ``usage``."""
        return f"{self.prefix}{USAGE}total"

    def tuning(self, model_id: str) -> str:
        """Hash of persisted adaptive-window state for this queue and model weights."""
        return f"{self.prefix}tuning:{model_id}"

    def window(self, worker_id: str) -> str:
        """Hash with one worker's current window, for ``inferq stats``."""
        return f"{self.prefix}window:{worker_id}"

    def cancels(self, worker_id: str) -> str:
        """List of request ids cancelled while ``worker_id`` ran them (``generate`` workers
        block on it with the wake list and drop the generation at its next decode step)."""
        return f"{self.prefix}{_CANCELS}{worker_id}"

    def held(self, worker_id: str) -> str:
        """Set of the identities (prefix hashes, sessions: ``inferq.protocol.prefix``) whose
        prompts ``worker_id``'s engine holds in its prefix cache, with a TTL the worker keeps
        refreshing: a claim under cache affinity prefers them (``lua/includes/affinity.lua``)."""
        return f"{self.prefix}{_HELD}{worker_id}"

    def inbox(self, client_id: str) -> str:
        """List of ``<id> <result>`` entries for one async client (its single waiting
        connection), pushed by whoever writes a result of a request that named it."""
        return f"{self.prefix}{_INBOX}{client_id}"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}{_REQ}{request_id}"

    def result(self, request_id: str) -> str:
        """A list holding exactly one msgpack result; readers block on it with BLMOVE."""
        return f"{self.prefix}{_RESULT}{request_id}"

    def stream(self, request_id: str) -> str:
        """A Redis Stream of a generation's text deltas (``generate``), with the result's TTL;
        readers follow it with ``XREAD BLOCK`` from the start."""
        return f"{self.prefix}{_STREAM}{request_id}"


def shard_of(request_id: str, shards: int) -> int:
    """The shard a request id always lands on, so a repeated id meets its first copy."""
    if shards <= 1:
        return 0
    return zlib.crc32(request_id.encode("utf-8")) % shards


@dataclass(frozen=True, slots=True)
class TenancyKeys:
    """Key names of API keys, dashboard sessions, per-tenant limits and usage
    (``inferq.tenancy``). All share the hash tag ``{<namespace>:tenancy}``: one slot, so each
    tenancy script touches one slot, and every gateway replica reads the same state. They
    start with ``<namespace>:`` like every other key, so an ACL user's ``~<namespace>:*``
    covers them."""

    namespace: str = DEFAULT_NAMESPACE

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{{{self.namespace}:tenancy}}:"

    @property
    def key_index(self) -> str:
        """Hash: key id -> sha256 of its secret (what ``inferq keys list`` walks)."""
        return f"{self.prefix}keys"

    def key(self, digest: str) -> str:
        """Hash: one API key's record, found by the sha256 of its secret."""
        return f"{self.prefix}key:{digest}"

    def session(self, digest: str) -> str:
        """Hash with a TTL: one dashboard session, by the sha256 of its cookie."""
        return f"{self.prefix}session:{digest}"

    def login_attempts(self, client: str) -> str:
        """Counter with a TTL: failed dashboard sign-ins from one client address."""
        return f"{self.prefix}login:{client}"

    def limits(self, tenant: str) -> str:
        """Hash: a tenant's token buckets (``rq`` requests, ``tk`` tokens), their last refill
        time (``ts``, ms) and the payload bytes its admitted requests hold (``qb``)."""
        return f"{self.prefix}bucket:{tenant}"

    def in_flight(self, tenant: str) -> str:
        """Sorted set: a tenant's unfinished requests through the gateway, scored by the time
        after which a lost one stops counting."""
        return f"{self.prefix}inflight:{tenant}"

    def queued_bytes(self, tenant: str) -> str:
        """Hash: what each of a tenant's admitted requests reserved, ``<id>`` ->
        ``"<tokens> <bytes>"``; settle gives it back (HDEL: once per id)."""
        return f"{self.prefix}reserved:{tenant}"
