"""Dashboard sessions: a random cookie whose sha256 names a Redis hash with a TTL.

The cookie never holds the key it was signed in with: the session holds that key's digest,
and each lookup checks the key still exists, so revoking a key ends its sessions; signing out
deletes the session; it expires after ``TTL_S`` in any case. Failed sign-ins are counted per
client address in a counter that expires after ``LOGIN_WINDOW_S``: past ``LOGIN_ATTEMPTS``
failures that address is refused (429) until the window ends, whatever it sends.
"""

from __future__ import annotations

import secrets

from inferq.plans import Direct, Plan, call
from inferq.protocol.keys import TenancyKeys
from inferq.protocol.ops import as_str
from inferq.tenancy.apikeys import digest

COOKIE = "inferq_session"
COOKIE_PREFIX = "iqs_"
TTL_S = 8 * 3600
#: What a session signed in with the operator's shared token holds instead of a key digest.
OPERATOR = "operator"
LOGIN_ATTEMPTS = 10
LOGIN_WINDOW_S = 300

# KEYS[1] counter; ARGV[1] window (s). Returns the failures so far, this one included.
_FAILED = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
"""


def new_cookie() -> str:
    return COOKIE_PREFIX + secrets.token_urlsafe(32)


def create_plan(keys: TenancyKeys, cookie: str, key_digest: str) -> Plan[None]:
    name = keys.session(digest(cookie))
    yield [call("hset", name, "key", key_digest), call("expire", name, TTL_S)]


def lookup_plan(keys: TenancyKeys, cookie: str) -> Plan[str | None]:
    """The key digest (or ``OPERATOR``) a live session stands for."""
    (found,) = yield [call("hget", keys.session(digest(cookie)), "key")]
    return as_str(found) if found is not None else None


def delete_plan(keys: TenancyKeys, cookie: str) -> Plan[None]:
    yield [call("delete", keys.session(digest(cookie)))]


def blocked_plan(keys: TenancyKeys, client: str) -> Plan[bool]:
    """Whether ``client`` has used up its failed sign-ins for now."""
    (count,) = yield [call("get", keys.login_attempts(client))]
    return count is not None and int(count) >= LOGIN_ATTEMPTS


def failed_plan(keys: TenancyKeys, client: str) -> Plan[int]:
    count = yield Direct(call("eval", _FAILED, 1, keys.login_attempts(client), LOGIN_WINDOW_S))
    return int(count)
