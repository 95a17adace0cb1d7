"""Out-of-memory recovery: learn how many padded tokens fit, per length bucket.

Activation memory grows with rows x width (and attention with width squared), so a limit
learned for short sequences says little about long ones. After an out-of-memory error the
governor caps the padded-token budget of that width's bucket below what failed; after a run
of successes in a bucket it relaxes the cap slowly, so a transient spike (another process on
the GPU) does not shrink batches forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def bucket_of(width: int) -> int:
    """Power-of-two ceiling of the padded width (1, 2, 4, ..., 512, ...)."""
    return 1 << max(0, (max(width, 1) - 1).bit_length())


@dataclass
class MemoryGovernor:
    max_tokens: int | None
    shrink: float = 0.5  # the halves that bisection runs next
    recover_factor: float = 1.1
    recover_after: int = 20
    limits: dict[int, int] = field(default_factory=dict)
    ooms: int = 0
    _streak: dict[int, int] = field(default_factory=dict)

    def budget(self, width: int) -> int | None:
        """Padded-token budget for a batch whose longest row is ``width``."""
        learned = self.limits.get(bucket_of(width))
        if learned is None:
            return self.max_tokens
        return learned if self.max_tokens is None else min(learned, self.max_tokens)

    def on_oom(self, width: int, rows: int) -> None:
        bucket = bucket_of(width)
        failed = rows * max(width, 1)
        self.limits[bucket] = max(width, int(failed * self.shrink))
        self._streak[bucket] = 0
        self.ooms += 1

    def on_success(self, width: int, rows: int) -> None:
        bucket = bucket_of(width)
        limit = self.limits.get(bucket)
        if limit is None:
            return
        streak = self._streak.get(bucket, 0) + 1
        if streak < self.recover_after:
            self._streak[bucket] = streak
            return
        self._streak[bucket] = 0
        relaxed = int(limit * self.recover_factor) + 1
        if self.max_tokens is not None and relaxed >= self.max_tokens:
            del self.limits[bucket]  # fully recovered
        else:
            self.limits[bucket] = relaxed

