"""Response bodies as JSON bytes: ``orjson`` when installed (the gateway extra pulls it; much
faster than the standard library on lists of floats), else ``json`` with compact
separators. Both write the same JSON values (floats round-trip exactly)."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - the gateway extra installs it
    orjson = None  # type: ignore[assignment]

#: Which encoder serves: ``orjson`` or ``json``.
ENCODER = "orjson" if orjson is not None else "json"


def dumps(value: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
