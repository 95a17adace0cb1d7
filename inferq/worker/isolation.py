"""Run a batch so that one bad request fails alone.

On an exception the batch is bisected and each half retried, down to the single request that
fails on its own. Out-of-memory errors are not the requests' fault: they are reported to the
caller (which lowers its token budget) and the halves simply run smaller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from inferq.errors import DeviceOutOfMemory, InferqError
from inferq.protocol.codec import ErrorInfo

log = logging.getLogger("inferq.worker")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Failure:
    error: ErrorInfo
    retryable: bool


def is_out_of_memory(exc: BaseException) -> bool:
    """``DeviceOutOfMemory``, or torch's own out-of-memory error (``torch.OutOfMemoryError``,
    which ``torch.cuda.OutOfMemoryError`` names), recognised without importing torch."""
    if isinstance(exc, DeviceOutOfMemory):
        return True
    return any(cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch")
               for cls in type(exc).__mro__)


def failure_of(exc: BaseException) -> Failure:
    if is_out_of_memory(exc) and not isinstance(exc, InferqError):
        exc = DeviceOutOfMemory(str(exc).splitlines()[0] if str(exc) else "out of memory")
    if isinstance(exc, InferqError):
        code, retryable = exc.code, exc.retryable
    else:
        # An unexpected exception may be transient (a CUDA hiccup); retries are bounded by the
        # request's max_attempts, after which it is dead-lettered with this error.
        code, retryable = "model_error", True
    return Failure(ErrorInfo(code=code, message=f"{type(exc).__name__}: {exc}"[:2000]),
                   retryable)


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
