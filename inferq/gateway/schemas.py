"""The native request API's bodies (``/v1/requests``), health and readiness, and the error
responses the OpenAPI schema lists. The OpenAI-compatible bodies are ``inferq.openai.schemas``'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from inferq.openai.schemas import (
    Body,
    DeadlineS,
    ErrorBody,
    ModelName,
    Priority,
    RequestId,
    TaskName,
)
from inferq.producer.replies import RequestState
from inferq.protocol.codec import Result

# --- native --------------------------------------------------------------------------------

class CreateRequest(Body):
    prompt: str
    model: ModelName
    task: TaskName = "embed"
    priority: Priority | None = Field(default=None, description="default: X-Priority, else 0")
    deadline_s: DeadlineS | None = Field(default=None, description="default: X-Deadline-S")
    tenant: str | None = Field(default=None, description="the tenant (fair shares) when "
                                                         "INFERQ_GATEWAY_TENANT_FROM=user")
    id: RequestId | None = Field(default=None, description="idempotency key: an existing id "
                                                           "returns that request")
    params: dict[str, Any] | None = Field(
        default=None, description="task parameters: values are strings, numbers, booleans, "
                                  "null, or lists / flat objects of those")
    max_attempts: Annotated[int, Field(ge=1, le=100, strict=True)] = 3

    @field_validator("params")
    @classmethod
    def _json_like(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # The protocol's ParamValue, checked here to name the key in one message.
        for key, item in (value or {}).items():
            if not _param_value(item):
                raise ValueError(f"params[{key!r}] must be a string, number, boolean or null, "
                                 "or a list or flat object of those")
        return value


_SCALARS = (str, int, float, bool, type(None))


def _param_value(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, _SCALARS) for v in value)
    if isinstance(value, dict):
        return all(isinstance(v, _SCALARS) for v in value.values())
    return isinstance(value, _SCALARS)


class ErrorInfoView(BaseModel):
    code: str
    message: str = ""


class ResultView(BaseModel):
    status: str
    output: Any = None
    error: ErrorInfoView | None = None
    worker: str | None = None
    attempts: int = 0
    batch_size: int | None = None
    enqueued_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    queue_wait_ms: float | None = None
    compute_ms: float | None = None
    total_ms: float | None = None

    @classmethod
    def of(cls, result: Result) -> ResultView:
        return cls(
            status=result.status.value, output=result.output,
            error=None if result.error is None else ErrorInfoView(
                code=result.error.code, message=result.error.message),
            worker=result.worker, attempts=result.attempts, batch_size=result.batch_size,
            enqueued_ms=result.enqueued_ms, started_ms=result.started_ms,
            finished_ms=result.finished_ms, queue_wait_ms=result.queue_wait_ms,
            compute_ms=result.compute_ms, total_ms=result.total_ms,
        )


class RequestView(BaseModel):
    id: str
    queue: str
    status: RequestState
    duplicate: bool | None = Field(default=None, description="on create: the id existed "
                                                             "already and nothing was queued")
    result: ResultView | None = None


# --- health and errors -------------------------------------------------------------------

class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready", "unready"]
    queue: str
    redis: bool
    live_workers: int
    reason: str | None = None


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "a field inferq does not implement, at a value that is not a no-op; error.param "
             "names it",
        401: "missing or wrong bearer token",
        422: "invalid request; error.param names the field",
        429: "queue full (back-pressure); see Retry-After",
        502: "the worker failed the request; error.code is its code",
        503: "Redis unavailable",
        504: "deadline passed or no result in time",
    }.items()
}
