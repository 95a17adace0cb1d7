"""Typed errors. Every error has a stable ``code`` that goes into result payloads and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from inferq.protocol.codec import Result


class InferqError(Exception):
    """Base class of every error inferq raises."""

    code: ClassVar[str] = "internal"
    #: Whether a worker should retry a request that failed with this error (with backoff).
    retryable: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ValidationError(InferqError, ValueError):
    """A request, result or option is malformed or out of range. Nothing was queued."""

    code = "invalid_request"


class PayloadTooLarge(ValidationError):
    code = "payload_too_large"


class QueueFull(InferqError):
    """The queue is at the depth limit for this priority (back-pressure); retry after
    ``retry_after_s``. Lower priorities are refused first (``inferq.Shedding``)."""

    code = "queue_full"

    def __init__(self, message: str, *, depth: int, max_depth: int,
                 accepted: list[Any] | None = None, refused: list[int] | None = None,
                 retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.depth = depth
        self.max_depth = max_depth
        #: When the excess should have drained at the recent completion rate.
        self.retry_after_s = retry_after_s
        #: For ``enqueue_many``: handles of the requests that did get in, indices of the others.
        self.accepted: list[Any] = accepted or []
        self.refused: list[int] = refused or []


class ConfigError(InferqError, ValueError):
    code = "invalid_config"


class ModelLoadError(InferqError):
    code = "model_load_failed"


class ResultTimeout(InferqError, TimeoutError):
    """No result arrived within the caller's timeout. The request itself is still queued."""

    code = "result_timeout"


class RequestError(InferqError):
    """The request finished without an output; ``result`` holds what the worker recorded."""

    def __init__(self, message: str, *, result: Result) -> None:
        super().__init__(message)
        self.result = result


class RequestFailed(RequestError):
    """The worker (or the queue, after the last attempt) recorded an error for the request."""

    code = "request_failed"

    @property
    def error_code(self) -> str:
        return self.result.error.code if self.result.error else self.code


class RequestCancelled(RequestError):
    code = "cancelled"


class DeadlineMissed(InferqError):
    """Worker side: a request's deadline passed before it could run."""

    code = "deadline_exceeded"


class DeadlineExceeded(RequestError):
    code = "deadline_exceeded"


class InvalidInput(InferqError):
    """Raised by a model for one request whose input it cannot process; fails that request only."""

    code = "invalid_input"


class UnknownModel(InferqError):
    code = "unknown_model"


class TransientError(InferqError):
    """Raised by a model for a failure worth retrying later (with backoff)."""

    code = "transient_error"
    retryable = True


class DeviceOutOfMemory(InferqError):
    """The device ran out of memory for a batch (models translate
    ``torch.cuda.OutOfMemoryError`` into this). The worker splits the batch and lowers its
    token budget; a request that does not fit even alone fails with ``out_of_memory``."""

    code = "out_of_memory"
    retryable = True
