"""Who a bearer secret (or a dashboard session) stands for.

The operator's shared token (``INFERQ_GATEWAY_TOKEN``) is one principal of every scope and no
tenant, so deployments from before tenant keys keep working. Any other secret is looked up as
an API key in Redis (``tenancy.apikeys``). Lookups are cached for ``CACHE_S`` (1 s): a key
revoked anywhere is refused by every gateway within it, and a busy gateway makes at most one
lookup per key per second.

The gateway is *open* (no auth at all, every caller the operator) only while no token is set
and no key exists in Redis; the first ``inferq keys create`` closes every gateway within
``CACHE_S``.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from inferq import plans
from inferq.protocol.keys import TenancyKeys
from inferq.tenancy import apikeys, sessions
from inferq.tenancy.apikeys import CACHE_S
from inferq.tenancy.principal import Principal

#: What a cache entry is a lookup of (the secret or cookie follows).
_KEY_TAG, _SESSION_TAG = "key:", "session:"
#: Bound on cached lookups; past it the cache starts over (a flood of distinct valid keys).
CACHE_ENTRIES = 10_000


@dataclass
class Authenticator:
    redis: Any
    names: TenancyKeys
    token: SecretStr | None
    _cache: dict[str, tuple[float, Principal | None]] = field(default_factory=dict)
    _open: tuple[float, bool] = (0.0, False)

    def __post_init__(self) -> None:
        self._token = (self.token.get_secret_value().encode() if self.token is not None
                       else None)

    async def is_open(self) -> bool:
        """No token and no key: this gateway admits every caller as the operator."""
        if self._token is not None:
            return False
        now = time.monotonic()
        expires, is_open = self._open
        if now >= expires:
            is_open = not await plans.run_async(self.redis, apikeys.any_keys_plan(self.names))
            self._open = (now + CACHE_S, is_open)
        return is_open

    async def bearer(self, secret: str) -> Principal | None:
        """The principal of a bearer secret, or None (unknown, revoked)."""
        if not secret:
            return None
        if self._token is not None and secrets.compare_digest(secret.encode(), self._token):
            return Principal.operator()
        if not secret.startswith(apikeys.SECRET_PREFIX):
            return None
        return await self._cached(_KEY_TAG + secret, self._key)

    async def session(self, cookie: str) -> Principal | None:
        """The principal a dashboard session cookie was signed in as, while it lasts."""
        if not cookie.startswith(sessions.COOKIE_PREFIX):
            return None
        return await self._cached(_SESSION_TAG + cookie, self._session)

    def forget_session(self, cookie: str) -> None:
        """Drop a signed-out session from this gateway's cache (others drop it within
        ``CACHE_S``)."""
        self._cache.pop(self._cache_key(_SESSION_TAG + cookie), None)

    @staticmethod
    def _cache_key(tagged: str) -> str:
        return hashlib.sha256(tagged.encode()).hexdigest()

    async def _key(self, secret: str) -> Principal | None:
        key = await plans.run_async(self.redis, apikeys.lookup_plan(self.names, secret))
        return key.principal() if key is not None else None

    async def _session(self, cookie: str) -> Principal | None:
        found = await plans.run_async(self.redis, sessions.lookup_plan(self.names, cookie))
        if found is None:
            return None
        if found == sessions.OPERATOR:
            return Principal.operator() if self._token is not None else None
        key = await plans.run_async(self.redis, apikeys.lookup_plan(self.names, found,
                                                                    by_digest=True))
        return key.principal() if key is not None else None

    async def _cached(self, tagged: str, look: Any) -> Principal | None:
        cache_key = self._cache_key(tagged)
        now = time.monotonic()
        hit = self._cache.get(cache_key)
        if hit is not None and now < hit[0]:
            return hit[1]
        found: Principal | None = await look(tagged.partition(":")[2])
        if found is not None:  # a miss is not cached: a key just created works at once
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[cache_key] = (now + CACHE_S, found)
        return found
