"""API keys: each belongs to one tenant and carries its scopes and ceilings.

Redis keeps only the sha256 of a secret (``TenancyKeys.key(digest)``, a hash holding the
key's record) and an index of key ids (``TenancyKeys.key_index``: id -> digest), written and
revoked together by one script each. A gateway authenticates a bearer secret with one
``HGETALL`` of its digest, so a key revoked on one gateway is refused by every gateway on its
next lookup (they cache a lookup for at most ``CACHE_S``).

The secret is printed once, at creation; nothing can show it again. Secrets are 32 random
bytes (``secrets.token_urlsafe``), so an unsalted fast hash is enough: there is nothing to
brute-force that a salt or a slow hash would protect.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from inferq import plans
from inferq.errors import ValidationError
from inferq.plans import Direct, Plan, call
from inferq.protocol.keys import DEFAULT_NAMESPACE, TenancyKeys, check_tenant
from inferq.protocol.ops import as_str
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN
from inferq.tenancy.principal import SCOPES, Principal, Scope

SECRET_PREFIX = "iq_"
#: How long a gateway trusts a lookup: a revoked key is refused everywhere within this.
CACHE_S = 1.0

# KEYS[1] the record, KEYS[2] the index; ARGV[1] id, ARGV[2] digest, ARGV[3..] the record's
# field/value pairs. Returns the id of the key with this secret (an existing one: no change).
_CREATE = """
local existing = redis.call('HGET', KEYS[1], 'id')
if existing then return existing end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return ARGV[1]
"""
# KEYS[1] index; ARGV[1] key id; ARGV[2] the records' key prefix. Returns 1 if revoked.
_REVOKE = """
local digest = redis.call('HGET', KEYS[1], ARGV[1])
if not digest then return 0 end
redis.call('DEL', ARGV[2] .. digest)
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key's record, as stored (never the secret)."""

    id: str
    tenant: str
    scopes: tuple[Scope, ...] = ("api",)
    name: str = ""
    max_priority: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_in_flight: int | None = None
    max_queued_bytes: int | None = None
    created_ms: int = 0
    #: The secret's first characters, to tell keys apart in a list.
    hint: str = ""

    def __post_init__(self) -> None:
        check_tenant(self.tenant)
        if not self.scopes or any(s not in SCOPES for s in self.scopes):
            raise ValidationError(f"scopes must be a non-empty subset of {list(SCOPES)}, "
                                  f"got {list(self.scopes)}", field="scope")
        if self.max_priority is not None and not (
                PRIORITY_MIN <= self.max_priority <= PRIORITY_MAX):
            raise ValidationError(f"max_priority must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], "
                                  f"got {self.max_priority}", field="max_priority")
        for name in ("requests_per_minute", "tokens_per_minute", "max_in_flight",
                     "max_queued_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValidationError(f"{name} must be a positive integer, got {value!r}",
                                      field=name)
        if len(self.name) > 200:
            raise ValidationError("name: at most 200 characters", field="name")

    def principal(self) -> Principal:
        return Principal(tenant=self.tenant, scopes=frozenset(self.scopes), key_id=self.id,
                         max_priority=self.max_priority,
                         requests_per_minute=self.requests_per_minute,
                         tokens_per_minute=self.tokens_per_minute,
                         max_in_flight=self.max_in_flight,
                         max_queued_bytes=self.max_queued_bytes)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["scopes"] = list(self.scopes)
        return out

    def record(self) -> list[str]:
        """Flat field/value pairs for ``HSET`` (absent limits are not stored)."""
        flat: list[str] = []
        for name, value in asdict(self).items():
            if value is None:
                continue
            flat += [name, ",".join(value) if name == "scopes" else str(value)]
        return flat

    @classmethod
    def from_record(cls, raw: dict[Any, Any]) -> ApiKey:
        fields = {as_str(k): as_str(v) for k, v in raw.items()}

        def number(name: str) -> int | None:
            return int(fields[name]) if name in fields else None

        return cls(id=fields["id"], tenant=fields["tenant"],
                   scopes=tuple(s for s in fields.get("scopes", "api").split(",") if s),  # type: ignore[misc]
                   name=fields.get("name", ""), max_priority=number("max_priority"),
                   requests_per_minute=number("requests_per_minute"),
                   tokens_per_minute=number("tokens_per_minute"),
                   max_in_flight=number("max_in_flight"),
                   max_queued_bytes=number("max_queued_bytes"),
                   created_ms=number("created_ms") or 0, hint=fields.get("hint", ""))


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just created: the only time its secret exists outside the caller."""

    key: ApiKey
    secret: str


#: A secret the operator supplies (``--secret-from-env``) must be at least this long.
MIN_SECRET_CHARS = 32


def check_secret(secret: str) -> str:
    if not secret.startswith(SECRET_PREFIX) or len(secret) < MIN_SECRET_CHARS or any(
            c.isspace() for c in secret):
        raise ValidationError(f"a key's secret must start with {SECRET_PREFIX!r}, hold no "
                              f"spaces and be at least {MIN_SECRET_CHARS} characters "
                              "(e.g. iq_$(openssl rand -hex 32))", field="secret")
    return secret


def new_key(tenant: str, *, scopes: Iterable[str] = ("api",), name: str = "",
            secret: str | None = None,
            max_priority: int | None = None, requests_per_minute: int | None = None,
            tokens_per_minute: int | None = None, max_in_flight: int | None = None,
            max_queued_bytes: int | None = None) -> NewKey:
    secret = SECRET_PREFIX + secrets.token_urlsafe(32) if secret is None else check_secret(secret)
    key = ApiKey(id="key_" + secrets.token_hex(8), tenant=tenant,
                 scopes=tuple(dict.fromkeys(scopes)),  # type: ignore[arg-type]
                 name=name, max_priority=max_priority, requests_per_minute=requests_per_minute,
                 tokens_per_minute=tokens_per_minute, max_in_flight=max_in_flight,
                 max_queued_bytes=max_queued_bytes, created_ms=int(time.time() * 1000),
                 hint=secret[:7])
    return NewKey(key, secret)


# --- plans: one description of each conversation, for the sync and the async client ------

def create_plan(keys: TenancyKeys, made: NewKey) -> Plan[str]:
    """Stores the key; the id stored under its secret (an earlier key's, if the secret was
    registered before: creating with a given secret is idempotent)."""
    stored = yield Direct(call("eval", _CREATE, 2, keys.key(digest(made.secret)),
                               keys.key_index, made.key.id, digest(made.secret),
                               *made.key.record()))
    return as_str(stored)


def list_plan(keys: TenancyKeys) -> Plan[list[ApiKey]]:
    (index,) = yield [call("hgetall", keys.key_index)]
    digests = [as_str(d) for d in index.values()]
    if not digests:
        return []
    records = yield [call("hgetall", keys.key(d)) for d in digests]
    found = [ApiKey.from_record(r) for r in records if r]
    return sorted(found, key=lambda k: (k.tenant, k.created_ms, k.id))


def revoke_plan(keys: TenancyKeys, key_id: str) -> Plan[bool]:
    done = yield Direct(call("eval", _REVOKE, 1, keys.key_index, key_id, keys.prefix + "key:"))
    return bool(done)


def lookup_plan(keys: TenancyKeys, secret: str, *, by_digest: bool = False
                ) -> Plan[ApiKey | None]:
    (raw,) = yield [call("hgetall", keys.key(secret if by_digest else digest(secret)))]
    return ApiKey.from_record(raw) if raw else None


def any_keys_plan(keys: TenancyKeys) -> Plan[bool]:
    (count,) = yield [call("hlen", keys.key_index)]
    return bool(count)


class KeyStore:
    """API keys on a synchronous client: what ``inferq keys`` and scripts use.

    ``inferq.Client(url).keys`` is one; ``KeyStore(redis_client)`` makes another."""

    def __init__(self, redis: Any, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.redis = redis
        self.names = TenancyKeys(namespace)

    def create(self, tenant: str, **options: Any) -> NewKey:
        """A new key of ``tenant`` (options as ``new_key``); its secret is in the result
        and nowhere else. With ``secret=`` (one the operator made), a secret registered
        before is not registered again: the result is that key."""
        made = new_key(tenant, **options)
        stored = plans.run(self.redis, create_plan(self.names, made))
        if stored != made.key.id:
            existing = self.lookup(made.secret)
            assert existing is not None, "a key with this secret vanished"
            return NewKey(existing, made.secret)
        return made

    def list(self, tenant: str | None = None) -> list[ApiKey]:
        found = plans.run(self.redis, list_plan(self.names))
        return [k for k in found if tenant is None or k.tenant == tenant]

    def revoke(self, key_id: str) -> bool:
        """True if the key existed; every gateway refuses it within ``CACHE_S``."""
        return plans.run(self.redis, revoke_plan(self.names, key_id))

    def lookup(self, secret: str) -> ApiKey | None:
        return plans.run(self.redis, lookup_plan(self.names, secret))
