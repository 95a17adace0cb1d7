"""Riding out Redis outages: exponential backoff, logged once per outage, never a crash."""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("inferq.worker")


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
