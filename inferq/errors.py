"""Typed errors. Every error has a stable ``code`` that goes into result payloads, metric labels
and the gateway's HTTP error bodies.

The hierarchy::

    InferqError                 internal
    ├── ValidationError         invalid_request       (also a ValueError)
    │   ├── PayloadTooLarge     payload_too_large
    │   └── CorruptRequest      corrupt_request       (a stored request found damaged)
    ├── ConfigError             invalid_config        (also a ValueError)
    │   └── UnknownModel        unknown_model
    ├── ModelLoadError          model_load_failed
    ├── BackendUnavailable      backend_unavailable   (also redis ConnectionError, TimeoutError)
    ├── QueueFull               queue_full
    │   ├── WouldMissSlo        would_miss_slo
    │   └── QueuedTokensFull    queued_tokens_full
    ├── DurabilityError         durability_unconfirmed
    ├── ResultTimeout           result_timeout        (also a TimeoutError)
    ├── RequestError            carries the request's stored ``Result``
    │   ├── RequestFailed       request_failed        (``error_code``: what the worker recorded)
    │   ├── RequestCancelled    cancelled
    │   └── DeadlineExceeded    deadline_exceeded
    ├── InvalidInput            invalid_input         (raised by models: fails one request)
    ├── TransientError          transient_error       (raised by models: retried)
    └── DeviceOutOfMemory       out_of_memory         (retried, with a smaller batch)

A worker records the code of what failed a request (a model's ``InvalidInput``, ...,
``DeadlineExceeded``) in its result; the SDK raises that again as ``RequestFailed``
(``error_code``) or ``DeadlineExceeded``. Two more codes are recorded without an error of
their own: ``MODEL_ERROR`` and ``MAX_ATTEMPTS`` (below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import redis.exceptions

if TYPE_CHECKING:
    from pydantic import ValidationError as PydanticValidationError

    from inferq.protocol.codec import Result

#: Recorded for a model's unexpected exception (retried within the request's attempts).
MODEL_ERROR = "model_error"
#: Recorded by the queue when the last allowed attempt was lost with its worker (inferq
#: before lost runs were counted apart from attempts; kept for the dead letters it wrote).
MAX_ATTEMPTS = "max_attempts"
#: Recorded by the queue (the reclaim script) for a request whose run was lost with its worker
#: ``max_crashes`` times while it ran alone: the evidence points at it, it is dead-lettered.
CRASHED_WORKER = "crashed_worker"


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

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        #: The request field or option at fault (``prompt``, ``params.max_new_tokens``, ...),
        #: when one is; None when the error concerns the whole request.
        self.field = field

    @classmethod
    def from_pydantic(cls, context: str, exc: PydanticValidationError) -> ValidationError:
        """``context`` followed by the first five field errors, each naming its field;
        ``field`` is the first one's."""
        parts = []
        first = None
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            first = first or (where if where != "<root>" else None)
            parts.append(f"{where}: {err['msg']}")
        return cls(context + "; ".join(parts), field=first)


class PayloadTooLarge(ValidationError):
    """A prompt, params, payload or result is over its ``inferq.Limits`` size."""

    code = "payload_too_large"


class CorruptRequest(ValidationError):
    """A stored request whose fields or payload are damaged (written by hand, a buggy producer
    with Redis access): it is answered with this code and never runs."""

    code = "corrupt_request"


class ConfigError(InferqError, ValueError):
    """An option of a client, worker or gateway is invalid; the message names the value."""

    code = "invalid_config"


class UnknownModel(ConfigError):
    """A worker was asked for a model it does not know (e.g. an unknown ``builtin:`` name)."""

    code = "unknown_model"


class ModelLoadError(InferqError):
    """A worker could not load its model: missing weights or packages, an unreadable folder."""

    code = "model_load_failed"


class BackendUnavailable(InferqError, redis.exceptions.ConnectionError,
                         redis.exceptions.TimeoutError):
    """The SDK could not reach Redis (refused, timed out, TLS handshake failed) after its
    retries; ``url`` is the server's, without its password. Also redis-py's ``ConnectionError``
    and ``TimeoutError``, so code that catches those keeps working. Authentication and ACL
    errors are not this: they keep their redis-py types."""

    code = "backend_unavailable"

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class QueueFull(InferqError):
    """The queue is at the depth limit for this priority (back-pressure), or the request's
    tenant is at its own limit (``tenant``); retry after ``retry_after_s``. Lower priorities
    are refused first (``inferq.Shedding``)."""

    code = "queue_full"

    def __init__(self, message: str, *, depth: int, max_depth: int,
                 accepted: list[Any] | None = None, refused: list[int] | None = None,
                 retry_after_s: float = 1.0, tenant: str | None = None) -> None:
        super().__init__(message)
        self.depth = depth
        self.max_depth = max_depth
        #: The tenant whose own limit (``inferq queue set --tenant-max-depth``) refused the
        #: request; None when the queue's limit did.
        self.tenant = tenant
        #: When the excess should have drained at the recent completion rate.
        self.retry_after_s = retry_after_s
        #: For ``enqueue_many``: handles of the requests that did get in, indices of the others.
        self.accepted: list[Any] = accepted or []
        self.refused: list[int] = refused or []


class WouldMissSlo(QueueFull):
    """Admission by prediction (``inferq queue set --admission predicted``) refused the
    request: the predicted time to its first token or result (``predicted_ms``) passes its
    objective (``slo_ms``, the ``ttft_slo_ms`` asked). Nothing was queued; a 429 at the
    gateway. A ``QueueFull``, so code that handles back-pressure handles it too."""

    code = "would_miss_slo"

    def __init__(self, message: str, *, predicted_ms: int, slo_ms: int, depth: int,
                 accepted: list[Any] | None = None, refused: list[int] | None = None,
                 retry_after_s: float = 1.0) -> None:
        super().__init__(message, depth=depth, max_depth=0, accepted=accepted,
                         refused=refused, retry_after_s=retry_after_s)
        self.predicted_ms = predicted_ms
        self.slo_ms = slo_ms


class QueuedTokensFull(QueueFull):
    """The request's priority band already holds so many estimated tokens pending that its
    own (``tokens``) would pass the queue's bound (``inferq queue set --max-queued-tokens``,
    ``max_queued_tokens`` per shard). Nothing was queued; a 429 at the gateway. A
    ``QueueFull``, so code that handles back-pressure handles it too."""

    code = "queued_tokens_full"

    def __init__(self, message: str, *, tokens: int, max_queued_tokens: int, depth: int,
                 accepted: list[Any] | None = None, refused: list[int] | None = None,
                 retry_after_s: float = 1.0) -> None:
        super().__init__(message, depth=depth, max_depth=0, accepted=accepted,
                         refused=refused, retry_after_s=retry_after_s)
        self.tokens = tokens
        self.max_queued_tokens = max_queued_tokens


class DurabilityError(InferqError):
    """``ClientOptions(durability=...)`` could not be confirmed: the server lacks WAITAOF or
    its AOF is off (``fsync``), or no replica / fsync acknowledged the write in time. When the
    wait timed out the request *was* queued; enqueueing it again with the same id is safe."""

    code = "durability_unconfirmed"

    def __init__(self, message: str, *, level: str) -> None:
        super().__init__(message)
        self.level = level


class ResultTimeout(InferqError, TimeoutError):
    """No result arrived within the caller's timeout. The request itself is still queued."""

    code = "result_timeout"


class RequestError(InferqError):
    """The request finished without an output; ``result`` holds what the worker recorded.
    A worker records an outcome from one made without a result (reading ``result`` then
    raises ``RuntimeError``, as httpx's unset ``RequestError.request`` does)."""

    def __init__(self, message: str, *, result: Result | None = None) -> None:
        super().__init__(message)
        self._result = result

    @property
    def result(self) -> Result:
        if self._result is None:
            raise RuntimeError(f"{type(self).__name__} was raised without a stored result")
        return self._result


class RequestFailed(RequestError):
    """The worker (or the queue, after the last attempt) recorded an error for the request."""

    code = "request_failed"

    @property
    def error_code(self) -> str:
        return self.result.error.code if self.result.error else self.code


class RequestCancelled(RequestError):
    """The request was cancelled (``Handle.cancel``) before it finished."""

    code = "cancelled"


class DeadlineExceeded(RequestError):
    """The request's deadline passed before it could run, in the queue or in a worker's
    window: it was answered ``expired`` without running."""

    code = "deadline_exceeded"


class InvalidInput(InferqError):
    """Raised by a model for one request whose input it cannot process; fails that request only."""

    code = "invalid_input"


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
