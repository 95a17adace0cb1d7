"""Run a batch so that one bad request fails alone: on an exception the batch is bisected and
each half retried, down to the single request that fails on its own."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from inferq.errors import InferqError
from inferq.protocol.codec import ErrorInfo

log = logging.getLogger("inferq.worker")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Failure:
    error: ErrorInfo


def error_info(exc: BaseException) -> ErrorInfo:
    code = exc.code if isinstance(exc, InferqError) else "model_error"
    message = f"{type(exc).__name__}: {exc}"
    return ErrorInfo(code=code, message=message[:2000])


def run_isolated(forward: Callable[[Sequence[T]], list[Any]],
                 items: Sequence[T]) -> list[Any | Failure]:
    """``forward(items)``; if it raises, bisect until every failing item is pinned down."""
    try:
        outputs = forward(items)
        if len(outputs) != len(items):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(items)} inputs")
        return outputs
    except Exception as exc:
        if len(items) == 1:
            log.warning("request failed in the model: %s", exc)
            return [Failure(error_info(exc))]
        mid = len(items) // 2
        log.warning("batch of %d failed (%s); bisecting", len(items), exc)
        return run_isolated(forward, items[:mid]) + run_isolated(forward, items[mid:])
