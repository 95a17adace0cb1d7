"""How many of a batch's lines may wait in the queue at once: enough to keep the workers busy
until the next feed, not so many that a backlog builds, and fewer while online traffic flows.

Online requests are a higher band and are claimed first whatever waits in ``pending``; but a
worker claims its next window while the current one runs, so batch lines waiting at that
moment fill the window an online request arriving just after must wait behind. So the feed
watches the queue: from the completions of the whole queue and of this batch (each step),
online traffic is the difference. While it flows, the batch gets only the share of the
measured capacity online traffic leaves, with a margin; once it has been quiet for
``quiet_s``, the batch gets the whole fleet. ``lead_s`` is how long the lines waiting should
last: the time the next feed may take to come.

Pure code: tested with a fake clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _ewma(old: float, sample: float, alpha: float) -> float:
    return sample if old == 0 else alpha * sample + (1 - alpha) * old


@dataclass
class Feed:
    floor: int = 64
    ceiling: int = 4096
    lead_s: float = 1.0
    #: The least the batch keeps waiting while online traffic flows (it always progresses).
    busy_floor: int = 8
    #: Online traffic counts as gone after this long without an online completion.
    quiet_s: float = 1.0
    #: Online traffic is given this multiple of its measured rate before the batch's share.
    margin: float = 2.0
    #: Weight of the newest rate sample (exponential moving average).
    alpha: float = 0.3
    rate: float = field(default=0.0, init=False)
    online: float = field(default=0.0, init=False)
    capacity: float = field(default=0.0, init=False)
    online_until: float = field(default=-math.inf, init=False)
    _last: tuple[float, int, int] | None = field(default=None, init=False)

    def observe(self, now: float, queue_done: int, batch_done: int) -> None:
        """The queue's and this batch's finished counts at ``now`` (seconds, monotonic)."""
        if self._last is None:
            self._last = (now, queue_done, batch_done)
            return
        then, queue_then, batch_then = self._last
        elapsed = now - then
        if elapsed < 0.25:  # a sample per quarter second at most: rates of bursts are noise
            return
        batch = max(0, batch_done - batch_then) / elapsed
        total = max(0, queue_done - queue_then) / elapsed
        online = max(0.0, total - batch)
        self.rate = _ewma(self.rate, batch, self.alpha)
        self.online = _ewma(self.online, online, self.alpha) if online or self.online else 0.0
        self.capacity = max(self.capacity * 0.999, total)
        if online > 0:
            self.online_until = now + self.quiet_s
        self._last = (now, queue_done, batch_done)

    def target(self, now: float) -> int:
        if now < self.online_until:
            share = max(0.0, self.capacity - self.margin * self.online)
            return max(self.busy_floor, min(self.ceiling, math.ceil(share * self.lead_s)))
        return max(self.floor, min(self.ceiling, math.ceil(
            max(self.rate, self.capacity) * self.lead_s)))

    def room(self, outstanding: int, now: float) -> int:
        """How many more lines to queue now."""
        return max(0, self.target(now) - outstanding)
