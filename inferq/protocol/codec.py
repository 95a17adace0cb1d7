"""Wire format: msgpack bodies validated by pydantic models on both sides. Never pickle.

``Result`` is the one definition of a result. It is written three ways, each checked against
it by a test: ``encode_result`` (the model), the worker's fast path for plain outputs
(``worker/core/results.py``: the same bytes, ``tests/unit/test_hotpath_results.py``), and the
scripts' error results (``lua/includes/results.lua``: only ``Result`` fields, and what they
write validates as a ``Result`` that forbids unknown fields)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Annotated, Any, Literal, cast

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from inferq.errors import PayloadTooLarge, ValidationError
from inferq.protocol.cost import ESTIMATED_TASKS, MAX_COST, estimate
from inferq.protocol.generation import MAX_MESSAGES, ChatMessage, FinishReason
from inferq.protocol.keys import NAME_RE
from inferq.protocol.prefix import SESSION_RE
from inferq.protocol.scores import MAX_SLO_MS, PRIORITY_MAX, PRIORITY_MIN
from inferq.tracing import MAX_TRACESTATE, TRACEPARENT_RE, check_tracestate, valid_ids

WIRE_VERSION = 1
MAX_DEADLINE_S = 366 * 24 * 3600.0
#: An id as a caller gives it (the gateway's routes, a batch line's ``custom_id``): 128 chars.
PUBLIC_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
#: An id as stored: a tenant's requests are ``<tenant>@<public id>`` (``tenancy.principal``),
#: so up to 64 + 1 + 128 characters.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,192}$")

JSONScalar = str | int | float | bool | None
ParamValue = JSONScalar | list[JSONScalar] | dict[str, JSONScalar]


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits, checked before anything is queued (producer) and before anything is run."""

    max_prompt_bytes: int = 1 << 20
    max_params_bytes: int = 64 << 10
    max_payload_bytes: int = 2 << 20
    max_result_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_params_bytes", "max_payload_bytes",
                     "max_result_bytes"):
            if getattr(self, name) < 1:
                raise ValidationError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")


DEFAULT_LIMITS = Limits()


class RequestPayload(BaseModel):
    """What a producer writes; the worker validates it again before running it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    id: Annotated[str, Field(pattern=ID_RE.pattern)]
    task: Annotated[str, Field(pattern=NAME_RE.pattern)]
    model: Annotated[str, Field(pattern=NAME_RE.pattern)]
    prompt: str
    priority: Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True)] = 0
    params: dict[str, ParamValue] = Field(default_factory=dict)
    deadline_s: Annotated[float, Field(strict=True, le=MAX_DEADLINE_S)] | None = None
    #: Runs allowed: a run counts when a worker starts the request on its model (not when it
    #: claims it); after the last failed or lost run the request is dead-lettered.
    max_attempts: Annotated[int, Field(ge=1, le=100, strict=True)] = 3
    #: Chat input for the ``generate`` task, rendered with the model's chat template; the
    #: prompt is then empty. Absent (None) from payloads that do not use it.
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None)
    #: Who sent it (``inferq.protocol.fair``): fair shares within a priority are per tenant.
    #: Absent (None) from payloads without one.
    tenant: Annotated[str, Field(pattern=NAME_RE.pattern)] | None = None
    #: The producer's cost of a request of a custom task (fair-share accounting; the built-in
    #: tasks estimate theirs from the text). Absent (None) from payloads without one.
    cost: Annotated[int, Field(ge=1, le=MAX_COST, strict=True)] | None = None
    #: The W3C trace context the request continues (``inferq.tracing``): the producer's
    #: ``enqueue`` span, or the caller's. Absent (None) from payloads without one.
    traceparent: Annotated[str, Field(pattern=TRACEPARENT_RE.pattern)] | None = None
    tracestate: Annotated[str, Field(max_length=MAX_TRACESTATE)] | None = None

    @field_validator("traceparent")
    @classmethod
    def _w3c_traceparent(cls, value: str | None) -> str | None:
        # The shape is checked by the pattern (in pydantic-core); what a pattern cannot say:
        if value is not None and not valid_ids(value):
            raise ValueError(f"traceparent has an invalid version or an all-zero id: {value}")
        return value

    @field_validator("tracestate")
    @classmethod
    def _w3c_tracestate(cls, value: str | None) -> str | None:
        return None if value is None else check_tracestate(value)
    #: The latency objective (``inferq.protocol.slo``): ms from enqueue by which the first
    #: token (generate) or the result (other tasks) should arrive. Absent (None) without one.
    ttft_slo_ms: Annotated[int, Field(ge=1, le=MAX_SLO_MS, strict=True)] | None = None
    #: The conversation it belongs to (cache affinity: ``inferq.protocol.prefix``): a
    #: ``generate`` request's claim may prefer the worker that ran the session's earlier
    #: turns. Absent (None) without one.
    session: Annotated[str, Field(pattern=SESSION_RE.pattern)] | None = None

    @field_validator("deadline_s")
    @classmethod
    def _finite_positive(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"deadline_s must be a finite number of seconds > 0, got {value}")
        return value

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> RequestPayload:
        if self.messages is not None and self.prompt:
            raise ValueError("give either a prompt or messages, not both")
        return self

    @field_validator("cost")
    @classmethod
    def _cost_of_custom_tasks(cls, value: int | None, info: ValidationInfo) -> int | None:
        task = info.data.get("task")
        if value is not None and task in ESTIMATED_TASKS:
            raise ValueError(f"cost is estimated from the text for task {task!r}; give it "
                             "only for custom tasks")
        return value

    @property
    def fair_cost(self) -> int:
        """The cost charged to the tenant at enqueue (``inferq.protocol.cost``)."""
        return estimate(self.task, self.text_bytes, self.params, self.cost)

    @property
    def text_bytes(self) -> int:
        """UTF-8 size of the input text: the prompt, or the messages' contents."""
        size = utf8_size(self.prompt, "prompt")
        for message in self.messages or ():
            size += utf8_size(message.content, "messages.content")
        return size


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    DEAD = "dead"


class Usage(BaseModel):
    """Token counts of a generation (or a scoring) request."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    message: str = ""


class Result(BaseModel):
    """The outcome of one request, stored under its own key. Times are Redis-clock ms."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = WIRE_VERSION
    id: str
    status: Status
    output: Any = None
    error: ErrorInfo | None = None
    task: str | None = None
    model: str | None = None
    worker: str | None = None
    attempts: int = 0
    batch_size: int | None = None
    #: Tokens the model saw for this request (after truncation), when the task tokenizes.
    input_tokens: int | None = None
    #: True when the input was longer than the model takes and was cut to its maximum length
    #: (``embed``: refuse instead with ``params={"truncate": False}``).
    truncated: bool | None = None
    enqueued_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    compute_ms: float | None = None
    #: ``generate``: why the generation ended (stop, length, cancelled).
    finish_reason: FinishReason | None = None
    #: ``generate`` / ``score``: prompt and completion token counts.
    usage: Usage | None = None
    #: ``generate``: ms from enqueue until the first generated text was visible to the producer
    #: (in the request's stream, or in the result for a worker that does not stream).
    ttft_ms: float | None = None
    #: The trace the request's spans belong to (32 hex, from its payload's ``traceparent``),
    #: when it carried one (docs/guides/tracing.md).
    trace_id: str | None = None
    #: Whether the request's ``ttft_slo_ms`` was met (``inferq.protocol.slo.met``); None when
    #: it had none.
    slo_met: bool | None = None
    #: Runs of this request lost with their worker before this one (the worker vanished while
    #: running it: not attempts, see ``attempts``); absent when none.
    lost_runs: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _cancelled_finish(cls, data: Any) -> Any:
        # A cancellation is recorded by the cancel script, which knows nothing of generation.
        if (isinstance(data, dict) and data.get("status") == Status.CANCELLED.value
                and data.get("finish_reason") is None):
            return {**data, "finish_reason": FinishReason.CANCELLED.value}
        return data

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def queue_wait_ms(self) -> float | None:
        """Time from enqueue to the (last) claim, on Redis' clock."""
        if self.enqueued_ms is None or self.started_ms is None:
            return None
        return float(self.started_ms - self.enqueued_ms)

    @property
    def total_ms(self) -> float | None:
        if self.enqueued_ms is None or self.finished_ms is None:
            return None
        return float(self.finished_ms - self.enqueued_ms)


def pack(obj: Any) -> bytes:
    """msgpack bytes; a value msgpack cannot carry (a lone surrogate, an int beyond 64 bits)
    is a ``ValidationError``, not a crash."""
    try:
        data: bytes = msgpack.packb(obj, use_bin_type=True)
    except (UnicodeEncodeError, OverflowError, TypeError, ValueError) as exc:
        raise ValidationError(f"cannot encode as msgpack: {type(exc).__name__}: {exc}") from exc
    return data


def utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{what} is not valid Unicode text: {exc}") from exc


def _no_ext(code: int, data: bytes) -> Any:
    # pydantic would read an ExtType (a namedtuple) as a list and accept it.
    raise ValueError(f"msgpack extension type {code} is not allowed")


def unpack(data: bytes, *, max_bytes: int) -> Any:
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"message of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
            TypeError) as exc:
        raise ValidationError(f"malformed msgpack: {exc}") from exc


def encode_request(payload: RequestPayload, limits: Limits = DEFAULT_LIMITS) -> bytes:
    prompt_bytes = payload.text_bytes
    if prompt_bytes > limits.max_prompt_bytes:
        raise PayloadTooLarge(
            f"prompt of {prompt_bytes} bytes exceeds the {limits.max_prompt_bytes}-byte limit"
        )
    params_bytes = len(pack(payload.params))
    if params_bytes > limits.max_params_bytes:
        raise PayloadTooLarge(
            f"params of {params_bytes} bytes exceed the {limits.max_params_bytes}-byte limit"
        )
    data = pack(payload.model_dump(mode="python", exclude=_absent(payload)))
    if len(data) > limits.max_payload_bytes:
        raise PayloadTooLarge(
            f"payload of {len(data)} bytes exceeds the {limits.max_payload_bytes}-byte limit"
        )
    return data


def decode_payload_fields(data: bytes) -> dict[str, Any]:
    """The fields of a payload ``encode_request`` wrote, in its order (packing them again
    gives the same bytes)."""
    fields: dict[str, Any] = msgpack.unpackb(data, raw=False)
    return fields


def _absent(payload: RequestPayload) -> set[str] | None:
    """The optional fields a payload leaves out (so one without them is as before they
    existed)."""
    absent = {name for name in ("messages", "tenant", "cost", "traceparent", "tracestate",
                            "ttft_slo_ms", "session")
              if getattr(payload, name) is None}
    return absent or None


def decode_request(data: bytes, limits: Limits = DEFAULT_LIMITS) -> RequestPayload:
    """Decode and validate one request payload; ``ValidationError`` (``PayloadTooLarge`` for a
    size) naming what is wrong."""
    [decoded] = decode_requests([data], limits)
    if isinstance(decoded, ValidationError):
        raise decoded
    return decoded


_REQUEST_LIST: TypeAdapter[list[RequestPayload]] = TypeAdapter(list[RequestPayload])


def decode_requests(datas: Sequence[bytes], limits: Limits = DEFAULT_LIMITS
                    ) -> list[RequestPayload | ValidationError]:
    """``decode_request`` for a window of payloads, each failing alone: the payload, or the
    error ``decode_request`` raises for it.

    One msgpack pass per payload, and one pydantic call for the whole window (a list of
    ``RequestPayload``: pydantic-core validates every item without coming back to Python,
    about 25% less CPU than a call per item, and less than the same checks written in Python:
    building the models is most of the cost). Only when that call refuses the list is each
    payload validated alone, which names the bad field of each bad one exactly as
    ``RequestPayload.model_validate`` does."""
    out: list[RequestPayload | ValidationError | None] = [None] * len(datas)
    raws: list[Any] = []
    where: list[int] = []
    for i, data in enumerate(datas):
        try:
            raws.append(unpack(data, max_bytes=limits.max_payload_bytes))
            where.append(i)
        except ValidationError as exc:
            out[i] = exc
    try:
        payloads: list[RequestPayload | ValidationError] = list(
            _REQUEST_LIST.validate_python(raws))
    except PydanticValidationError:
        payloads = [_validate_request(raw) for raw in raws]
    for i, payload in zip(where, payloads, strict=True):
        out[i] = payload if isinstance(payload, ValidationError) else _check_sizes(
            payload, len(datas[i]), limits)
    return cast("list[RequestPayload | ValidationError]", out)


def _validate_request(raw: Any) -> RequestPayload | ValidationError:
    try:
        return RequestPayload.model_validate(raw)
    except PydanticValidationError as exc:
        return ValidationError.from_pydantic("invalid request payload: ", exc)


def _check_sizes(payload: RequestPayload, size: int,
                 limits: Limits) -> RequestPayload | ValidationError:
    """The prompt and params limits, for a payload of ``size`` bytes. A prompt's UTF-8 bytes
    lie in the payload as they are (a msgpack str or bin), and params packed again grow by at
    most 9/5 of their size there (a float32 becomes a float64; pydantic's conversions only
    shrink them): a payload small enough for a limit cannot break it, and skips measuring."""
    try:
        if ((size > limits.max_prompt_bytes or payload.messages is not None)
                and payload.text_bytes > limits.max_prompt_bytes):
            return PayloadTooLarge(f"prompt exceeds the {limits.max_prompt_bytes}-byte limit")
        if (payload.params and 2 * size > limits.max_params_bytes
                and len(pack(payload.params)) > limits.max_params_bytes):
            return PayloadTooLarge(f"params exceed the {limits.max_params_bytes}-byte limit")
    except ValidationError as exc:  # text or params msgpack cannot carry
        return exc
    return payload


def encode_result(result: Result, limits: Limits = DEFAULT_LIMITS) -> bytes:
    data = pack(result.model_dump(mode="python", exclude_none=True))
    if len(data) > limits.max_result_bytes:
        raise PayloadTooLarge(
            f"result of {len(data)} bytes exceeds the {limits.max_result_bytes}-byte limit"
        )
    return data


#: ``Result``'s fields in declaration order: the order ``encode_result`` writes them in.
RESULT_FIELDS: tuple[str, ...] = tuple(Result.model_fields)


def _plain(value: Any) -> Any:
    """A result field's value as ``Result.model_dump`` gives it (nested models as maps, enums
    as their string values: msgpack writes a ``StrEnum`` member as its value anyway)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="python", exclude_none=True)
    if isinstance(value, Enum):
        return value.value
    return value


def encode_result_fields(fields: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS,
                         packer: msgpack.Packer | None = None) -> bytes:
    """``encode_result(Result(**fields))`` without building the model: the same bytes for the
    worker's own fields (str, int, float, enums, ``ErrorInfo``, ``Usage``, an output of
    msgpack types). Unknown fields are dropped and None fields left out, as there.

    Raises whatever ``encode_result(Result(**fields))`` would not, for an output msgpack
    cannot carry as it is (``TypeError``, ``ValueError``, ``OverflowError``): the caller then
    takes that path, which converts what pydantic converts and fails what it fails."""
    body: dict[str, Any] = {"v": WIRE_VERSION}
    for name in RESULT_FIELDS[1:]:
        value = fields.get(name)
        if value is not None:
            body[name] = value if name == "output" else _plain(value)
    data: bytes = (packer.pack(body) if packer is not None
                   else msgpack.packb(body, use_bin_type=True))
    if len(data) > limits.max_result_bytes:
        raise PayloadTooLarge(
            f"result of {len(data)} bytes exceeds the {limits.max_result_bytes}-byte limit")
    return data


def decode_result(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Result:
    raw = unpack(data, max_bytes=limits.max_result_bytes)
    try:
        return Result.model_validate(raw)
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic("invalid result: ", exc) from exc


_RESULT_LIST: TypeAdapter[list[Result]] = TypeAdapter(list[Result])


def decode_results(datas: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> list[Result]:
    """``decode_result`` of each, validated in one pydantic call; a ``ValidationError`` if any
    is refused (``decode_result`` of each then names which and why)."""
    raws = [unpack(data, max_bytes=limits.max_result_bytes) for data in datas]
    try:
        return _RESULT_LIST.validate_python(raws)
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic("invalid result: ", exc) from exc


def build_request(prompt: object, *, messages: object = None, **fields: object) -> RequestPayload:
    """Validate producer arguments (``RequestPayload``'s fields; absent ones take its defaults)
    into a payload, raising ``ValidationError`` naming the field."""
    if not isinstance(prompt, str):
        raise ValidationError(f"prompt must be a str, got {type(prompt).__name__}")
    fields["prompt"] = prompt
    if fields.get("params") is None:
        fields["params"] = {}
    if messages is not None:
        if isinstance(messages, str | bytes) or not isinstance(messages, list | tuple):
            raise ValidationError(
                f"messages must be a list of {{role, content}} mappings, got "
                f"{type(messages).__name__}")
        fields["messages"] = list(messages)
    try:
        payload = RequestPayload.model_validate(fields)
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic("invalid request: ", exc) from exc
    if payload.messages is None and not payload.prompt.strip():
        # As OpenAI's API: an empty input is a mistake, not a request for a zero vector.
        raise ValidationError("prompt is empty or only whitespace: give some text (or "
                              "messages, for generate)", field="prompt")
    return payload
