"""The OpenAI-compatible request and response bodies (``/v1/embeddings``, ``/v1/completions``,
``/v1/chat/completions``) and OpenAI's error body. Constraints reuse the protocol's own
constants, so a request the gateway accepts is one the SDK accepts, and a 422 names the
offending field. Pure pydantic: the gateway's routes and the batch runner both read them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inferq.openai import fields
from inferq.protocol.codec import PUBLIC_ID_RE
from inferq.protocol.generation import (
    MAX_MESSAGES,
    MAX_NEW_TOKENS_LIMIT,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    SEED_MAX,
    UNSUPPORTED,
    ChatMessage,
)
from inferq.protocol.keys import NAME_RE
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN

ModelName = Annotated[str, Field(pattern=NAME_RE.pattern, examples=["minilm"])]
TaskName = Annotated[str, Field(pattern=NAME_RE.pattern)]
RequestId = Annotated[str, Field(pattern=PUBLIC_ID_RE.pattern)]
Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True,
                                description="higher is served first; FIFO within a priority")]
DeadlineS = Annotated[float, Field(gt=0, allow_inf_nan=False,
                                   description="relative deadline: still queued after this "
                                               "many seconds = answered 'expired', never run")]


class Body(BaseModel):
    # No silently dropped options: an unknown field is a 422 that names it.
    model_config = ConfigDict(extra="forbid")



# --- OpenAI-compatible ---------------------------------------------------------------------

class EmbeddingsRequest(Body):
    """``dimensions`` and ``truncate_prompt_tokens`` are accepted at their no-op values only
    (``fields.EMBEDDINGS``)."""

    input: str | list[str] = Field(description="a text or a list of texts (token arrays are "
                                               "not supported: inferq tokenizes on the worker)")
    model: ModelName
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = Field(default=None, description="the tenant (fair shares) when "
                                                       "INFERQ_GATEWAY_TENANT_FROM=user")
    # inferq extensions (the OpenAI SDK sends them with ``extra_body=``); they win over the
    # X-Priority / X-Deadline-S headers.
    priority: Priority | None = None
    deadline_s: DeadlineS | None = None

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        return fields.drop_noops(data, fields.EMBEDDINGS)

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


# --- OpenAI-compatible text generation ----------------------------------------------------

class StreamOptions(Body):
    include_usage: bool = Field(default=False, description="a last chunk (no choices) carries "
                                                           "the token usage")
    continuous_usage_stats: bool = Field(default=False, description="vLLM's usage in every "
                                                                    "chunk: only false")

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous(cls, value: bool) -> bool:
        if value:
            raise PydanticCustomError(UNSUPPORTED, "not supported: usage comes in the last "
                                      "chunk (include_usage)")
        return value


class _GenerationBody(Body):
    """What ``/v1/completions`` and ``/v1/chat/completions`` share; each maps onto a
    ``generate`` request's params (``max_tokens`` is ``max_new_tokens``)."""

    model: ModelName
    max_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS_LIMIT, strict=True)] | None = Field(
        default=None, description="tokens to generate at most (default: the worker's, 128)")
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS_LIMIT,
                                                strict=True)] | None = Field(
        default=None, description="the newer name of max_tokens; give one of them")
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = Field(
        default=None, description="0 (the default) is greedy decoding, deterministic")
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Field(ge=0, le=SEED_MAX, strict=True)] | None = Field(
        default=None, description="makes sampling reproducible")
    stop: str | list[str] | None = Field(default=None, description=f"up to {MAX_STOP_STRINGS} "
                                                                   "stop strings")
    stream: bool = Field(default=False, description="server-sent events of chunks, then "
                                                    "`data: [DONE]`")
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="the tenant (fair shares) when "
                                                       "INFERQ_GATEWAY_TENANT_FROM=user")
    # vLLM's sampling extensions (the OpenAI SDK sends them with ``extra_body=``), implemented
    # by the generate worker (``GenerationParams``).
    top_k: Annotated[int, Field(ge=-1, le=1_000_000, strict=True)] | None = Field(
        default=None, description="0 or -1: off")
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)] | None = (
        Field(default=None, description="1.0: off"))
    min_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS_LIMIT, strict=True)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, strict=True)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool | None = Field(default=None, description="keep generating past the "
                                                               "end-of-sequence token")
    # inferq extensions: priority and deadline_s win over the X-Priority / X-Deadline-S
    # headers; resumable keeps the generation running when a stream's client goes away.
    priority: Priority | None = None
    deadline_s: DeadlineS | None = None
    resumable: bool = Field(default=False, description="stream: keep generating when the "
                            "client disconnects, so that it can resume with GET "
                            "/v1/requests/{id}/stream and Last-Event-ID (default: a "
                            "disconnected stream cancels its request)")

    _refused_fields: ClassVar[Mapping[str, fields.Refused]] = fields.GENERATION

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        return fields.drop_noops(data, cls._refused_fields)

    @field_validator("temperature", "top_p", "min_p", "repetition_penalty", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"must be a number, got {type(value).__name__}")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None:
            return value
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or any(not isinstance(s, str) for s in items):
            raise ValueError("must be a string or a list of strings")
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}")
        for s in items:
            if not 1 <= len(s) <= MAX_STOP_CHARS:
                raise ValueError(f"each stop string must have 1..{MAX_STOP_CHARS} characters, "
                                 f"got {s!r}")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_tokens") is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return value

    @model_validator(mode="after")
    def _no_logprobs_in_streams(self) -> _GenerationBody:
        if self.stream and self.wants_logprobs:
            raise PydanticCustomError(
                UNSUPPORTED, "logprobs: not supported with stream: true (log-probabilities "
                "come in the non-streamed response)", {"param": "logprobs"})
        return self

    @property
    def wants_logprobs(self) -> bool:
        return False

    def logprob_params(self) -> dict[str, Any]:
        return {}

    def params(self) -> dict[str, Any]:
        """The ``generate`` params: only what the caller set (the worker has the defaults)."""
        limit = self.max_tokens if self.max_tokens is not None else self.max_completion_tokens
        values: dict[str, Any] = {
            "max_new_tokens": limit, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": None if self.top_k is None else max(self.top_k, 0), "seed": self.seed,
            "stop": [self.stop] if isinstance(self.stop, str) else self.stop,
            "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "min_tokens": self.min_tokens, "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos, **self.logprob_params()}
        return {k: v for k, v in values.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationBody):
    _refused_fields: ClassVar[Mapping[str, fields.Refused]] = fields.COMPLETION

    prompt: str = Field(description="one text (lists and token arrays are not supported)")
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS, strict=True)] | None = Field(
        default=None, description="return each token's log-probability and this many most "
                                  "likely alternatives (non-streamed responses)")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def logprob_params(self) -> dict[str, Any]:
        if self.logprobs is None:
            return {}
        return {"logprobs": True, "top_logprobs": self.logprobs}

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError("must be a string (lists and token arrays are not supported)")
        return value


class ChatCompletionRequest(_GenerationBody):
    _refused_fields: ClassVar[Mapping[str, fields.Refused]] = fields.CHAT

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] = Field(
        description="the chat so far, rendered with the model's chat template on the worker; "
                    "content is a string or a list of text parts")
    logprobs: bool | None = Field(default=None, description="return each token's "
                                  "log-probability (non-streamed responses)")
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS, strict=True)] | None = Field(
        default=None, description="with logprobs: this many most likely alternatives")

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise PydanticCustomError("value_error", "top_logprobs: needs logprobs: true",
                                      {"param": "top_logprobs"})
        return self

    def logprob_params(self) -> dict[str, Any]:
        if not self.logprobs:
            return {}
        return {"logprobs": True, "top_logprobs": self.top_logprobs or 0}


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: dict[str, Any] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: dict[str, Any] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage


# --- errors --------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str
    param: str | None = None
    request_id: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
