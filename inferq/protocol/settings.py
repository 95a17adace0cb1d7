"""Queue-level settings stored in Redis (the ``config`` hash on shard 0), so that every
producer and worker of a queue agrees on them without a flag that must match everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferq.errors import ValidationError

MAX_SHARDS = 1024


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

    @property
    def claim_shards(self) -> int:
        return max(self.shards, self.shards_seen)


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
    return QueueSettings(shards, seen, depth if depth is not None and depth >= 0 else None)
