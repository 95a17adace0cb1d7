"""Riding out Redis outages: exponential backoff, logged once per outage, never a crash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

log = logging.getLogger("inferq.worker")
T = TypeVar("T")

#: How long a starting worker asks again a server that may be restarting (refused or closed
#: connections, timeouts, a server loading its data) before it gives up with the reason.
STARTUP_WAIT_S = 10.0


def may_pass(exc: BaseException) -> bool:
    """A Redis error that a restarting server gives (a refused, reset or closed connection, a
    timeout, LOADING), not a refused password or a TLS failure (those do not fix themselves).
    Reads the exception's causes too (``BackendUnavailable`` wraps redis-py's)."""
    seen: BaseException | None = exc
    passing = False
    while seen is not None:
        if isinstance(seen, (ssl.SSLError, redis.AuthenticationError)):
            return False
        passing = passing or isinstance(seen, (redis.ConnectionError, redis.TimeoutError,
                                               ConnectionError, TimeoutError))
        seen = seen.__cause__ or seen.__context__
    return passing


async def ride_out(step: Callable[[], Awaitable[T]], what: str, *,
                   wait_s: float = STARTUP_WAIT_S) -> T:
    """``step()``, asked again with backoff while it fails with an error that ``may_pass``,
    for up to ``wait_s``; then the last error is raised."""
    give_up = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return await step()
        except Exception as exc:
            if not may_pass(exc) or time.monotonic() + delay > give_up:
                raise
            if delay == 0.05:
                log.warning("%s: Redis not available yet (%s: %s); asking again for up to "
                            "%g s", what, type(exc).__name__, exc, give_up - time.monotonic())
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


class RedisBackoff:
    def __init__(self, what: str, *, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.what = what
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0

    @property
    def delay_s(self) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** max(self.failures - 1, 0)))

    def note(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 20 == 0:
            log.warning("%s: Redis unavailable (%s: %s); retrying with backoff (failure %d)",
                        self.what, type(exc).__name__, exc, self.failures)

    async def failed(self, exc: BaseException, stop: asyncio.Event | None = None) -> None:
        self.note(exc)
        if stop is None:
            await asyncio.sleep(self.delay_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), self.delay_s)

    def succeeded(self) -> None:
        if self.failures:
            log.warning("%s: Redis reachable again after %d failed attempts", self.what,
                        self.failures)
        self.failures = 0
