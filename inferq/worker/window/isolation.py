"""Run a batch so that one bad request fails alone.

On an exception the batch is bisected and each half retried, down to the single request that
fails on its own. Out-of-memory errors are not the requests' fault: they are reported to the
caller (which lowers its token budget) and the halves simply run smaller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from inferq.worker.core.failures import Failure, failure_of, is_out_of_memory

log = logging.getLogger("inferq.worker")
T = TypeVar("T")


def run_isolated(forward: Callable[[Sequence[T]], list[Any]], items: Sequence[T], *,
                 on_oom: Callable[[Sequence[T]], None] | None = None) -> list[Any | Failure]:
    """``forward(items)``; if it raises, bisect until every failing item is pinned down."""
    try:
        outputs = forward(items)
        if len(outputs) != len(items):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(items)} inputs")
        return outputs
    except Exception as exc:
        if is_out_of_memory(exc) and on_oom is not None:
            on_oom(items)
        if len(items) == 1:
            log.warning("request failed in the model: %s", exc)
            return [failure_of(exc)]
        mid = len(items) // 2
        log.warning("batch of %d failed (%s: %s); bisecting", len(items), type(exc).__name__,
                    exc)
        return (run_isolated(forward, items[:mid], on_oom=on_oom)
                + run_isolated(forward, items[mid:], on_oom=on_oom))
