"""How many of a batch's lines may wait in the queue at once: enough to keep the workers busy
until the next feed, not so many that a backlog builds. Online requests are a higher band and
are claimed first whatever waits, but a short batch backlog also keeps the batch's own
cancel and expiry cheap and the workers' windows free of stale lines.

The target is the batch's measured completion rate times ``lead_s`` (the time the next feed
may take to come), between ``floor`` and ``ceiling``. Pure code: tested with a fake clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Feed:
    floor: int = 64
    ceiling: int = 4096
    lead_s: float = 2.0
    #: Weight of the newest rate sample (exponential moving average).
    alpha: float = 0.3
    rate: float = field(default=0.0, init=False)
    _last: float | None = field(default=None, init=False)
    _since: int = field(default=0, init=False)

    def finished(self, n: int, now: float) -> None:
        """``n`` lines finished at ``now`` (seconds, monotonic)."""
        if self._last is None:
            self._last = now
            return
        self._since += n
        elapsed = now - self._last
        if elapsed >= 0.25:  # a sample per quarter second at most: rates of bursts are noise
            sample = self._since / elapsed
            self.rate = sample if self.rate == 0 else (
                self.alpha * sample + (1 - self.alpha) * self.rate)
            self._last, self._since = now, 0

    def target(self) -> int:
        return max(self.floor, min(self.ceiling, math.ceil(self.rate * self.lead_s)))

    def room(self, outstanding: int) -> int:
        """How many more lines to queue now."""
        return max(0, self.target() - outstanding)
