"""Long waits as a series of short blocking reads.

A wait on Redis (``BLMOVE`` on a result key) may last minutes or forever, but every socket has
a read timeout (``ConnectionSettings.socket_timeout``) so that a hung server is detected. So a
wait is sliced: each call blocks in Redis for at most ``MAX_BLOCK_S``, well under the read
timeout, until the result arrives or the caller's own timeout has passed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from inferq.connection import MAX_BLOCK_S
from inferq.errors import ValidationError


def slices(timeout: float | None, read_timeout: float | None = None) -> Iterator[float]:
    """The block (seconds, > 0) of each successive call; ends once ``timeout`` has passed
    (None: never). Each is at most ``MAX_BLOCK_S`` and half the socket's ``read_timeout``.
    Validates ``timeout`` as ``block_timeout`` does."""
    cap = MAX_BLOCK_S if read_timeout is None else min(MAX_BLOCK_S, read_timeout / 2)
    if timeout is None:
        while True:
            yield cap
    deadline = time.monotonic() + block_timeout(timeout)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        # Redis takes fractional seconds with millisecond resolution; 0 would block forever.
        yield max(min(remaining, cap), 0.001)


def block_timeout(timeout: float | None) -> int:
    """BLMOVE's timeout argument: 0 blocks forever; Redis takes fractional seconds, though
    redis-py annotates it as int."""
    if timeout is None:
        return 0
    if not timeout > 0:
        raise ValidationError(f"timeout must be > 0 seconds or None, got {timeout}")
    return timeout  # type: ignore[return-value]
