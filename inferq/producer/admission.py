"""What a producer reads for admission by prediction (``inferq.protocol.slo``): with a queue's
settings, the fleet's service rate from the live workers' published figures, read (like the
settings) at most once per ``ClientOptions.settings_ttl_s``."""

from __future__ import annotations

from typing import Any

from inferq.errors import QueuedTokensFull
from inferq.plans import Plan, call
from inferq.protocol import slo
from inferq.protocol.keys import QueueKeys
from inferq.protocol.settings import settings_from_hash
from inferq.stats import new_windows


def read_settings(queue: QueueKeys) -> Plan[tuple[Any, float | None, slo.TokenService | None]]:
    """The config hash of ``queue`` (shard 0) and, when its admission is ``predicted``, the
    requests per second its live window workers serve and the tokens its live ``generate``
    workers serve (each None when unknown or not needed)."""
    (raw,) = yield [call("hgetall", queue.config)]
    settings = settings_from_hash(raw)
    if settings.admission != "predicted":
        return raw, None, None
    (now,) = yield [call("execute_command", "TIME")]
    seen: set[str] = set()
    windows: list[dict[str, str]] = []
    for shard in queue.shards(settings.claim_shards):
        windows += yield from new_windows(shard, now, seen)
    return raw, slo.fleet_rate(windows), slo.fleet_tokens(windows)


def tokens_full(queue: str, tokens: int, policy: str, depth: int, retry_after_ms: int, *,
                refused: list[int] | None = None, total: int = 1,
                accepted: list[Any] | None = None) -> QueuedTokensFull:
    """The error of requests refused for their band's queued tokens (``slo.TOKENS_FULL``):
    ``tokens``, the largest refused request's estimate; ``policy``, the one they carried."""
    bound = slo.max_queued_tokens(policy)
    what = "request refused" if total == 1 else f"{len(refused or ())} of {total} requests refused"
    return QueuedTokensFull(
        f"{what}: its priority band on queue {queue} holds too many estimated tokens pending "
        f"for its {tokens} more (bound {bound} per shard, inferq queue set "
        f"--max-queued-tokens); retry after {retry_after_ms / 1e3:.1f} s", tokens=tokens,
        max_queued_tokens=bound, depth=depth, accepted=accepted, refused=refused,
        retry_after_s=retry_after_ms / 1e3)
