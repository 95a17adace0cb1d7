"""Every failure becomes an OpenAI-shaped body: ``{"error": {"message", "type", "code",
"param", "request_id"}}``, with the status code that tells a client what to do next.

- ``ValidationError`` and body/header/query validation: 422, ``invalid_request`` (or
  ``payload_too_large``), ``param`` names the field.
- A field inferq does not implement, at a value that is not a no-op (``fields``), or a
  non-text chat content part: 400 ``unsupported_parameter``, ``param`` names it.
- ``QueueFull``: 429 with ``Retry-After``: the queue's own estimate (``QueueFull.retry_after_s``,
  when the excess drains at the recent completion rate), rounded up, at least
  ``INFERQ_GATEWAY_RETRY_AFTER_S``; ``queue_full``.
- A model no worker has ever served: 404 ``model_not_found`` (``model_not_found``).
- ``DeadlineExceeded``: 504 ``deadline_exceeded``; ``ResultTimeout``: 504 ``result_timeout``.
- ``RequestCancelled``: 409 ``cancelled``.
- ``RequestFailed``: 502 with the worker's code (``model_error``, ``max_attempts``, ...), but
  422 when that code says the input itself is bad (``invalid_input``, ...).
- ``BackendUnavailable`` (and any other Redis error): 503 ``backend_unavailable`` (details go
  to the log only).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from inferq.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    InferqError,
    PayloadTooLarge,
    QueueFull,
    RequestCancelled,
    RequestError,
    RequestFailed,
    ResultTimeout,
    ValidationError,
)
from inferq.openai.schemas import ErrorBody, ErrorDetail
from inferq.protocol.generation import UNSUPPORTED

log = logging.getLogger("inferq.gateway")

#: Worker error codes that mean "this input is bad", not "the service is broken".
CLIENT_ERROR_CODES = frozenset({"invalid_input", "invalid_request", "payload_too_large"})

INVALID = "invalid_request_error"


class ApiError(Exception):
    """An error response: raised by a route and rendered by the gateway's handler
    (``inferq.gateway.errors``), or written into a batch's error file."""

    def __init__(self, status: int, type: str, code: str, message: str, *,
                 param: str | None = None, request_id: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.code = code
        self.message = message
        self.param = param
        self.request_id = request_id
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return ErrorBody(error=ErrorDetail(message=self.message, type=self.type, code=self.code,
                                           param=self.param, request_id=self.request_id)
                         ).model_dump()


def from_inferq(exc: InferqError, *, retry_after_s: int = 1,
                param: str | None = None) -> ApiError:
    """The HTTP form of an SDK error; ``param`` names the input it concerns, if known."""
    request_id = exc.result.id if isinstance(exc, RequestError) else None
    kw: dict[str, Any] = {"param": param, "request_id": request_id}
    if isinstance(exc, QueueFull):
        wait = max(retry_after_s, math.ceil(exc.retry_after_s))
        return ApiError(429, "rate_limit_error", exc.code, exc.message,
                        headers={"Retry-After": str(wait)}, **kw)
    if isinstance(exc, DeadlineExceeded | ResultTimeout):
        return ApiError(504, "timeout_error", exc.code, exc.message, **kw)
    if isinstance(exc, RequestCancelled):
        return ApiError(409, "conflict_error", exc.code, exc.message, **kw)
    if isinstance(exc, RequestFailed):
        code = exc.error_code
        if code in CLIENT_ERROR_CODES:
            return ApiError(422, INVALID, code, exc.message, **kw)
        return ApiError(502, "upstream_error", code, exc.message, **kw)
    if isinstance(exc, PayloadTooLarge | ValidationError):
        return ApiError(422, INVALID, exc.code, exc.message, **kw)
    if isinstance(exc, BackendUnavailable):
        return unavailable(exc)
    log.error("unexpected inferq error: %s", exc, exc_info=exc)
    return ApiError(500, "server_error", exc.code, "internal error", **kw)


def model_not_found(model: str, task: str | None) -> ApiError:
    """OpenAI's answer for an unknown model (its clients do not retry a 404)."""
    served = f" for task {task!r}" if task else ""
    return ApiError(404, INVALID, "model_not_found",
                    f"The model {model!r} does not exist or no worker has ever served it"
                    f"{served}; GET /v1/models lists the served models "
                    "(start one with: inferq worker --model ...)", param="model")


def unavailable(exc: Exception) -> ApiError:
    """Redis is unreachable: the detail (host, port) goes to the log, not to the caller."""
    log.warning("redis unavailable: %s", exc)
    return ApiError(503, "service_unavailable", BackendUnavailable.code,
                    "the queue backend (Redis) is unavailable")


def param_of(loc: Sequence[int | str]) -> str:
    """``("body", "input", 3)`` -> ``input[3]``; ``("header", "x-priority")`` -> ``X-Priority``."""
    where, *path = loc if loc else ("body",)
    if where == "header" and path:
        return "-".join(part.capitalize() for part in str(path[0]).split("-"))
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or str(where)


def validation_error(problems: Sequence[Mapping[str, Any]]) -> ApiError:
    """A 422 naming the fields of pydantic's ``errors()``; a 400 ``unsupported_parameter``
    when the body asks for what inferq does not implement (``fields``, non-text content
    parts)."""
    errors = list(problems)
    unsupported = [e for e in errors if e.get("type") == UNSUPPORTED]
    if unsupported:
        errors = unsupported
    params = [_param(e) for e in errors]
    messages = []
    for p, e in zip(params, errors, strict=True):
        text = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        messages.append(text if text.startswith(f"{p}: ") else f"{p}: {text}")
    message = "; ".join(messages)
    if unsupported:
        return ApiError(400, INVALID, UNSUPPORTED, message, param=params[0])
    return ApiError(422, INVALID, ValidationError.code, message or "invalid request",
                    param=params[0] if params else None)


def _param(error: Mapping[str, Any]) -> str:
    """The field an error is about: its ``ctx['param']`` (a model-level check that names one),
    else its location."""
    ctx = error.get("ctx") or {}
    loc = tuple(error.get("loc", ()))
    named = ctx.get("param") if isinstance(ctx, Mapping) else None
    if isinstance(named, str):
        return param_of((*loc, named))
    return param_of(loc)
