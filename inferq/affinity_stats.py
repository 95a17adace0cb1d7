"""Cache affinity's figures, from what generate workers publish in their window hashes
(``inferq.worker.generate.affinity.affinity_fields``): the prefix cache's hit rate (prompt
tokens reused ÷ prompt tokens), the tokens it saved (those reused), and the share of claims
taken by affinity preference (affinity claims ÷ all claims). ``inferq stats`` and the
dashboard (``/admin/overview``) both read them here, per worker and summed per queue.

The counts are since each worker started, so a queue's sum covers its live workers only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AffinityFigures:
    prompt_tokens: int
    reused_tokens: int
    claimed: int
    affinity_claimed: int
    held_prefixes: int

    @property
    def hit_rate(self) -> float | None:
        """Prompt tokens reused ÷ prompt tokens (None before the first prompt)."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def claim_share(self) -> float | None:
        """Affinity claims ÷ all claims (None before the first claim)."""
        return self.affinity_claimed / self.claimed if self.claimed else None

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "tokens_saved": self.reused_tokens,
                "hit_rate": self.hit_rate, "claimed": self.claimed,
                "affinity_claimed": self.affinity_claimed, "claim_share": self.claim_share,
                "held_prefixes": self.held_prefixes}


def _int(window: Mapping[str, Any], name: str) -> int:
    try:
        return int(window.get(name, 0))
    except (TypeError, ValueError):  # a malformed field counts as nothing, alone
        return 0


def worker_figures(window: Mapping[str, Any]) -> AffinityFigures | None:
    """One worker's figures; None from a worker that publishes none (not a generate worker
    with cache affinity's fields)."""
    if "prefix_prompt_tokens" not in window:
        return None
    return AffinityFigures(
        prompt_tokens=_int(window, "prefix_prompt_tokens"),
        reused_tokens=_int(window, "prefix_reused_tokens"),
        claimed=_int(window, "claimed"), affinity_claimed=_int(window, "affinity_claimed"),
        held_prefixes=_int(window, "held_prefixes"))


def queue_figures(windows: Iterable[Mapping[str, Any]]) -> AffinityFigures | None:
    """The figures of a queue's live workers, summed (None when none publishes them)."""
    every = [f for f in map(worker_figures, windows) if f is not None]
    if not every:
        return None
    return AffinityFigures(
        prompt_tokens=sum(f.prompt_tokens for f in every),
        reused_tokens=sum(f.reused_tokens for f in every),
        claimed=sum(f.claimed for f in every),
        affinity_claimed=sum(f.affinity_claimed for f in every),
        held_prefixes=sum(f.held_prefixes for f in every))
