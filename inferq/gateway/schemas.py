"""Request and response bodies. Constraints reuse the protocol's own constants, so a request
the gateway accepts is one the SDK accepts, and a 422 names the offending field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferq.producer.common import RequestState
from inferq.protocol.codec import ID_RE, Result
from inferq.protocol.keys import NAME_RE
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN

ModelName = Annotated[str, Field(pattern=NAME_RE.pattern, examples=["minilm"])]
TaskName = Annotated[str, Field(pattern=NAME_RE.pattern)]
RequestId = Annotated[str, Field(pattern=ID_RE.pattern)]
Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True,
                                description="higher is served first; FIFO within a priority")]
DeadlineS = Annotated[float, Field(gt=0, allow_inf_nan=False,
                                   description="relative deadline: still queued after this "
                                               "many seconds = answered 'expired', never run")]


class _Body(BaseModel):
    # No silently dropped options: an unknown field is a 422 that names it.
    model_config = ConfigDict(extra="forbid")


# --- OpenAI-compatible ---------------------------------------------------------------------

class EmbeddingsRequest(_Body):
    input: str | list[str] = Field(description="a text or a list of texts (token arrays are "
                                               "not supported: inferq tokenizes on the worker)")
    model: ModelName
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, description="accepted for compatibility; unused")
    dimensions: int | None = Field(default=None, description="not supported: models return "
                                                             "their native size")
    # inferq extensions (the OpenAI SDK sends them with ``extra_body=``); they win over the
    # X-Priority / X-Deadline-S headers.
    priority: Priority | None = None
    deadline_s: DeadlineS | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        # One clear message instead of pydantic's one per union member.
        if not isinstance(value, str | list) or (
                isinstance(value, list) and any(not isinstance(v, str) for v in value)):
            raise ValueError("must be a string or a list of strings (token arrays are not "
                             "supported)")
        if isinstance(value, list) and not value:
            raise ValueError("must not be an empty list")
        return value

    @field_validator("dimensions")
    @classmethod
    def _no_dimensions(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("is not supported: inferq models return their native vector size")
        return value


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian "
                                                     "float32 when encoding_format=base64")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


# --- native --------------------------------------------------------------------------------

class CreateRequest(_Body):
    prompt: str
    model: ModelName
    task: TaskName = "embed"
    priority: Priority | None = Field(default=None, description="default: X-Priority, else 0")
    deadline_s: DeadlineS | None = Field(default=None, description="default: X-Deadline-S")
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


# --- errors and health ---------------------------------------------------------------------

class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    param: str | None = None
    request_id: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


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
        401: "missing or wrong bearer token",
        422: "invalid request; error.param names the field",
        429: "queue full (back-pressure); see Retry-After",
        502: "the worker failed the request; error.code is its code",
        503: "Redis unavailable",
        504: "deadline passed or no result in time",
    }.items()
}
