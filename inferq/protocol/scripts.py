"""The Lua scripts: every state change of a request is exactly one of these atomic calls.

Each script is a file, ``inferq/protocol/lua/<name>.lua``, that opens with a header naming
its input (``KEYS[i] name``; ``ARGV[i] name``, ``ARGV[i..] rows of W: ...`` for a flat run
of per-request values, ``ARGV[i] packed rows of W: ...`` for them packed into one msgpack
argument) and its output. ``ops.<name>_call`` builds that input: a test
(``tests/unit/test_script_headers.py``) checks every header against it. Helpers live in
``lua/includes/``; a script names those it uses with ``-- @include <helper>`` lines (a
helper may include others; each is put in once, before the lines that need it).

This module loads them: in front of every script it puts the names the scripts share with
Python, generated from their one source (the request hash's fields and states and the stream
entry fields from ``fields``, the per-request key suffixes from ``keys``, the result wire
version from ``codec``), then the included helpers, then the script.

What the scripts hold to (the request hash's fields are described in ``fields``): each reads
the time from Redis ``TIME`` and builds per-request keys from ``prefix``
(``inferq:{task:model}:``), so every key it touches lives in the queue shard's slot (see
``keys``). A request's hash exists exactly until its result is written: every script that
writes a result deletes the hash in the same call, and enqueue refuses an id whose result
still exists, so a matching lease token (a field of the hash) proves that no result exists
yet: first writer wins without an ``EXISTS`` per request. A result ``<prefix>result:<id>`` is
a list holding one msgpack ``codec.Result`` with a TTL; waiters block on it with
``BLMOVE key key``, so a waiting producer is woken by the write itself.

Redis has no rollback: a script that raises keeps what it wrote before. So each script reads
every field it acts on (``HMGET`` through ``redis.pcall``, so a key of another type is
noticed, not raised on) and checks it before its first write. A request whose fields are
damaged fails alone with a ``corrupt_request`` result; raw keys that cannot be tied to a
request are dropped, counted in the stats hash (``garbage``) and returned to the worker,
which logs them.
"""

from __future__ import annotations

import re
from importlib import resources

from inferq.protocol import cost, fields, keys, prefix, scores
from inferq.protocol.codec import WIRE_VERSION
from inferq.protocol.keys import QUEUED_TOKENS, TENANT_COUNT, USAGE, USAGE_RETENTION_MS

#: Every script, by name (its file is ``lua/<name>.lua``).
NAMES = ("enqueue", "claim", "peek", "start", "heartbeat", "complete", "reclaim", "release",
         "cancel", "stream", "stream_end", "requeue", "purge", "hold")

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)


def _read(path: str) -> str:
    return (resources.files("inferq.protocol") / "lua" / path).read_text(encoding="utf-8")


def constants() -> str:
    """The Lua locals every script starts with, generated from their Python source."""
    suffixes = ", ".join(f"'{suffix}'" for suffix in keys.PER_REQUEST.values())
    names = ", ".join(f"K_{name.upper()}" for name in keys.PER_REQUEST)
    return (fields.lua_constants()
            + f"local {names} = {suffixes}\n"
            + f"local RESULT_VERSION = {WIRE_VERSION}\n"
            + f"local K_USAGE, USAGE_RETENTION_MS = '{USAGE}', {USAGE_RETENTION_MS}\n"
            + fair_constants())


def fair_constants() -> str:
    """The score layout and fair-share limits (``scores``, ``inferq.protocol.fair``) as Lua."""
    values = {"BAND_WIDTH": scores.SEQ_LIMIT, "TIE_LIMIT": scores.TIE_LIMIT,
              "VT_LIMIT": scores.VT_LIMIT, "FAIR_RESET_AT": cost.RESET_AT,
              "FAIR_MAX_WEIGHT": cost.MAX_WEIGHT, "FAIR_MAX_COST": cost.MAX_COST,
              "DEADLINE_SPLIT": scores.DEADLINE_SPLIT,
              "DEADLINE_TIE_LIMIT": scores.DEADLINE_TIE_LIMIT,
              "DEADLINE_OFFSET_LIMIT": scores.DEADLINE_OFFSET_LIMIT,
              "DEADLINE_VT_LIMIT": scores.DEADLINE_VT_LIMIT, "MAX_SLO_MS": scores.MAX_SLO_MS}
    return (f"local {', '.join(values)} = "
            f"{', '.join(str(v) for v in values.values())}\n"
            f"local TENANT_COUNT = '{TENANT_COUNT}'\n"
            f"local QUEUED_TOKENS = '{QUEUED_TOKENS}'\n"
            f"local AFFINITY_HEX, AFFINITY_CHAIN = {prefix.HASH_HEX}, {prefix.MAX_CHAIN}\n"
            f"local AFFINITY_WINDOW, AFFINITY_MAX_HELD = {prefix.CLAIM_WINDOW}, "
            f"{prefix.MAX_HELD}\n"
            f"local AFFINITY_SATURATED = '{prefix.SATURATED}'\n")


def _expand(text: str, done: set[str]) -> str:
    """``text`` with each ``@include`` line replaced by the helper (itself expanded), or by
    nothing when the helper is already in."""
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in done:
            return ""
        done.add(name)
        return _expand(_read(f"includes/{name}.lua"), done)

    return _INCLUDE.sub(include, text)


def source(name: str) -> str:
    """The full source of one script, as Redis runs it."""
    return constants() + _expand(_read(f"{name}.lua"), set())


ALL: dict[str, str] = {name: source(name) for name in NAMES}
