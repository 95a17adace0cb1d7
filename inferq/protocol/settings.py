"""Queue-level settings stored in Redis (the ``config`` hash on shard 0), so that every
producer and worker of a queue agrees on them without a flag that must match everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from inferq.errors import ValidationError
from inferq.protocol.cost import DEFAULT_WEIGHT, MAX_WEIGHT, check_weight
from inferq.protocol.keys import check_tenant

if TYPE_CHECKING:
    from inferq.protocol.slo import TokenService

MAX_SHARDS = 1024
#: How long a claim under cache affinity may pass a request over (ms), by default.
DEFAULT_AFFINITY_MAX_WAIT_MS = 500
MAX_AFFINITY_WAIT_MS = 600_000


@dataclass(frozen=True, slots=True)
class QueueSettings:
    #: Shards new requests spread over.
    shards: int = 1
    #: The most shards this queue has ever had: workers claim from all of them, so requests
    #: left in a shard after the count was lowered are still served.
    shards_seen: int = 1
    #: Pending depth at which the queue sheds (per-priority shares apply); None = the
    #: producer's own ``max_queue_depth``.
    max_depth: int | None = None
    #: The queue wait the autoscaling signal keeps under (ms); None: ``autoscale``'s default.
    target_wait_ms: int | None = None
    #: The autoscaling signal drops to 0 after this long idle (s); None: its default.
    scale_to_zero_after_s: float | None = None
    #: Fair-share weight per named tenant (``inferq.protocol.fair``), sorted by name.
    tenant_weights: tuple[tuple[str, int], ...] = ()
    #: The weight of every tenant not named in ``tenant_weights`` (and of requests without
    #: a tenant).
    default_weight: int = DEFAULT_WEIGHT
    #: Pending-depth limit per named tenant (split over the shards like ``max_depth``).
    tenant_max_depth: tuple[tuple[str, int], ...] = ()
    #: The order inside a band: ``fair`` (tenants' fair shares, FIFO without tenants) or
    #: ``deadline`` (earliest objective first: ``inferq.protocol.slo``).
    order: str = "fair"
    #: ``predicted``: refuse at enqueue a request whose objective the queue cannot meet
    #: (``inferq.WouldMissSlo``); ``off``: admit all.
    admission: str = "off"
    #: The bound on the estimated tokens pending per priority band (split over the shards);
    #: a request that would pass it is refused (``inferq.QueuedTokensFull``). None: no bound.
    max_queued_tokens: int | None = None
    #: Cache affinity (``inferq.worker.generate.affinity``): ``off`` (claims take the head),
    #: ``prefix`` or ``session`` (a claim prefers, inside the head's band, the requests whose
    #: prefix or session the worker holds), and how much longer a request may wait for it.
    affinity: str = "off"
    affinity_max_wait_ms: int = DEFAULT_AFFINITY_MAX_WAIT_MS
    #: Not stored: the fleet's service rate (requests/s) a producer read with the settings
    #: for ``predicted`` admission (``producer.admission``); None when unknown.
    service_rate: float | None = None
    #: Not stored: what the live ``generate`` workers serve in tokens (``slo.TokenService``),
    #: read with ``service_rate``; None when unknown.
    token_service: TokenService | None = None

    @property
    def claim_shards(self) -> int:
        return max(self.shards, self.shards_seen)

    def weight(self, tenant: str | None) -> int:
        """The fair-share weight of ``tenant`` (None: a request without one)."""
        if tenant:
            for name, weight in self.tenant_weights:
                if name == tenant:
                    return weight
        return self.default_weight

    def tenant_limit(self, tenant: str | None) -> int:
        """The tenant's pending-depth limit (0: none)."""
        if tenant:
            for name, limit in self.tenant_max_depth:
                if name == tenant:
                    return limit
        return 0

    @property
    def tenants(self) -> frozenset[str]:
        """The tenants the operator named (the only ones with a metric label of their own)."""
        return frozenset(n for n, _ in self.tenant_weights + self.tenant_max_depth)


def check_shards(shards: int) -> int:
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ValidationError(f"shards must be an integer in 1..{MAX_SHARDS}, got {shards!r}")
    return shards


def _int(raw: Mapping[Any, Any], name: str) -> int | None:
    value = raw.get(name, raw.get(name.encode()))
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def settings_from_hash(raw: Mapping[Any, Any]) -> QueueSettings:
    """Parse an ``HGETALL`` of the config hash; absent or unreadable fields keep defaults."""
    shards = _int(raw, "shards")
    shards = shards if shards is not None and 1 <= shards <= MAX_SHARDS else 1
    seen = _int(raw, "shards_seen")
    seen = max(shards, seen if seen is not None and 1 <= seen <= MAX_SHARDS else 1)
    depth = _int(raw, "max_depth")
    wait = _int(raw, "target_wait_ms")
    idle = _int(raw, "scale_to_zero_after_s")
    tokens = _int(raw, "max_queued_tokens")
    default = _int(raw, DEFAULT_WEIGHT_FIELD)
    wait_ms = _int(raw, "affinity_max_wait_ms")
    weights: dict[str, int] = {}
    limits: dict[str, int] = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        try:
            number = int(value)
        except (TypeError, ValueError):
            continue
        if name.startswith(WEIGHT_PREFIX) and 1 <= number <= MAX_WEIGHT:
            weights[name[len(WEIGHT_PREFIX):]] = number
        elif name.startswith(TENANT_DEPTH_PREFIX) and number >= 1:
            limits[name[len(TENANT_DEPTH_PREFIX):]] = number
    return QueueSettings(
        shards, seen, depth if depth is not None and depth >= 0 else None,
        wait if wait is not None and wait >= 1 else None,
        float(idle) if idle is not None and idle >= 1 else None,
        tenant_weights=tuple(sorted(weights.items())),
        default_weight=default if default is not None and 1 <= default <= MAX_WEIGHT
        else DEFAULT_WEIGHT,
        tenant_max_depth=tuple(sorted(limits.items())),
        order=_choice(raw, "order", ORDERS), admission=_choice(raw, "admission", ADMISSIONS),
        max_queued_tokens=tokens if tokens is not None and tokens >= 1 else None,
        affinity=_choice(raw, "affinity", AFFINITIES),
        affinity_max_wait_ms=wait_ms if wait_ms is not None
        and 0 <= wait_ms <= MAX_AFFINITY_WAIT_MS else DEFAULT_AFFINITY_MAX_WAIT_MS)


#: The values of ``order`` and ``admission`` (the first is the default).
ORDERS = ("fair", "deadline")
ADMISSIONS = ("off", "predicted")
AFFINITIES = ("off", "prefix", "session")


def _choice(raw: Mapping[Any, Any], name: str, choices: tuple[str, ...]) -> str:
    value = raw.get(name, raw.get(name.encode()))
    text = value.decode() if isinstance(value, bytes) else value
    return text if text in choices else choices[0]


#: Fields of the config hash for fair shares: ``tenant_weight:<tenant>``,
#: ``tenant_max_depth:<tenant>`` and ``default_weight``.
WEIGHT_PREFIX = "tenant_weight:"
TENANT_DEPTH_PREFIX = "tenant_max_depth:"
DEFAULT_WEIGHT_FIELD = "default_weight"

#: Update a queue's tenants atomically (its config hash). KEYS[1] = config; ARGV: triples
#: (field, value, op), op ``set`` or ``del``. Returns the hash (HGETALL).
SET_TENANTS = """
for i = 1, #ARGV, 3 do
  if ARGV[i + 2] == 'del' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return redis.call('HGETALL', KEYS[1])
"""


def tenants_call(config_key: str, *, weights: Mapping[str, int] | None = None,
                 default_weight: int | None = None,
                 max_depths: Mapping[str, int] | None = None,
                 remove: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Keys and arguments of ``SET_TENANTS``: set weights, the default weight, per-tenant
    depth limits (0 removes a tenant's limit), and ``remove`` tenants (weight and limit)."""
    args: list[str] = []
    for tenant, weight in (weights or {}).items():
        check_weight(weight, f"the weight of tenant {check_tenant(tenant)!r}")
        args += [WEIGHT_PREFIX + tenant, str(weight), "set"]
    if default_weight is not None:
        args += [DEFAULT_WEIGHT_FIELD, str(check_weight(default_weight, "default weight")),
                 "set"]
    for tenant, limit in (max_depths or {}).items():
        check_tenant(tenant)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValidationError(
                f"the max depth of tenant {tenant!r} must be an integer >= 0, got {limit!r}")
        args += [TENANT_DEPTH_PREFIX + tenant, str(limit), "set" if limit else "del"]
    for tenant in remove:
        check_tenant(tenant)
        args += [WEIGHT_PREFIX + tenant, "", "del", TENANT_DEPTH_PREFIX + tenant, "", "del"]
    return [config_key], args


#: Update a queue's settings atomically (one key: its config hash). KEYS[1] = config;
#: ARGV[1] = shards ("" keeps it), ARGV[2] = max_depth ("" keeps it, "-" removes it),
#: ARGV[3..] = optional (name, value) pairs of the autoscaling settings.
#: ``shards_seen`` becomes the most shards ever set, so lowering the count keeps old shards
#: served. Returns the hash (HGETALL). Kept here, beside the settings it writes; it touches
#: no queue state, only the settings hash.
SET_SETTINGS = """
local seen = tonumber(redis.call('HGET', KEYS[1], 'shards_seen') or '1') or 1
local current = tonumber(redis.call('HGET', KEYS[1], 'shards') or '1') or 1
if current > seen then seen = current end
if ARGV[1] ~= '' then
  local shards = tonumber(ARGV[1])
  if shards > seen then seen = shards end
  redis.call('HSET', KEYS[1], 'shards', shards, 'shards_seen', seen)
end
if ARGV[2] == '-' then
  redis.call('HDEL', KEYS[1], 'max_depth')
elseif ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'max_depth', ARGV[2])
end
for i = 3, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return redis.call('HGETALL', KEYS[1])
"""


def settings_call(config_key: str, shards: int | None,
                  max_depth: int | Literal["keep"] | None, *,
                  target_wait_ms: int | None = None,
                  scale_to_zero_after_s: int | None = None, order: str | None = None,
                  admission: str | None = None,
                  max_queued_tokens: int | None = None, affinity: str | None = None,
                  affinity_max_wait_ms: int | None = None) -> tuple[list[str], list[str]]:
    """Keys and arguments of ``SET_SETTINGS``; ``max_depth`` None removes the queue's limit;
    the autoscaling settings, the order, the admission and the bound on queued tokens are
    kept when None (``max_queued_tokens`` 0 removes the bound)."""
    if shards is not None:
        check_shards(shards)
    if isinstance(max_depth, int) and (isinstance(max_depth, bool) or max_depth < 0):
        raise ValidationError(f"max_depth must be an integer >= 0, got {max_depth!r}")
    depth = "" if max_depth == "keep" else "-" if max_depth is None else str(max_depth)
    args = ["" if shards is None else str(shards), depth]
    for name, value in (("target_wait_ms", target_wait_ms),
                        ("scale_to_zero_after_s", scale_to_zero_after_s)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"{name} must be an integer >= 1, got {value!r}")
            args += [name, str(value)]
    if max_queued_tokens is not None:
        if (isinstance(max_queued_tokens, bool) or not isinstance(max_queued_tokens, int)
                or max_queued_tokens < 0):
            raise ValidationError(
                f"max_queued_tokens must be an integer >= 0, got {max_queued_tokens!r}")
        args += ["max_queued_tokens", str(max_queued_tokens)]
    if affinity_max_wait_ms is not None:
        if (isinstance(affinity_max_wait_ms, bool) or not isinstance(affinity_max_wait_ms, int)
                or not 0 <= affinity_max_wait_ms <= MAX_AFFINITY_WAIT_MS):
            raise ValidationError(f"affinity_max_wait_ms must be an integer in "
                                  f"0..{MAX_AFFINITY_WAIT_MS}, got {affinity_max_wait_ms!r}")
        args += ["affinity_max_wait_ms", str(affinity_max_wait_ms)]
    for name, choice, choices in (("order", order, ORDERS), ("admission", admission, ADMISSIONS),
                                  ("affinity", affinity, AFFINITIES)):
        if choice is not None:
            if choice not in choices:
                raise ValidationError(f"{name} must be one of {', '.join(choices)}, "
                                      f"got {choice!r}")
            args += [name, choice]
    return [config_key], args


def pairs(raw: Any) -> dict[str, str]:
    """An HGETALL reply from a script (a flat list) as a mapping."""
    items = [x.decode() if isinstance(x, bytes) else str(x) for x in raw]
    return dict(zip(items[::2], items[1::2], strict=True))
