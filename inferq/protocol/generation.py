"""Parameters of the ``generate`` and ``score`` tasks, and the shape of their outputs.

Pure pydantic (no torch): the producer SDK validates a request's params with these models before
queueing it, and the worker validates them again before running it. Every error names the field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import PydanticCustomError

from inferq.errors import ValidationError

GENERATE_TASK = "generate"
SCORE_TASK = "score"
#: Tasks served by causal language models.
LM_TASKS = frozenset({GENERATE_TASK, SCORE_TASK})

MAX_NEW_TOKENS_LIMIT = 8192
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 128
MAX_MESSAGES = 256
SEED_MAX = (1 << 63) - 1
MAX_STOP_TOKEN_IDS = 64
TOKEN_ID_MAX = (1 << 31) - 1
MAX_TOP_LOGPROBS = 20
#: The error type of a refusal: the request is well-formed but asks for something inferq does
#: not do (the gateway answers it with a 400 ``unsupported_parameter``, not a 422).
UNSUPPORTED = "unsupported_parameter"
#: Content part types that carry text (OpenAI's chat format); their texts are joined with a
#: newline, as vLLM does.
TEXT_PARTS = frozenset({"text", "input_text"})


class FinishReason(StrEnum):
    #: The model produced its end-of-sequence token, or the text reached a stop string.
    STOP = "stop"
    #: ``max_new_tokens`` (or the model's context length) was reached.
    LENGTH = "length"
    #: The producer cancelled the request while it ran.
    CANCELLED = "cancelled"


class ChatMessage(BaseModel):
    """One turn of a chat; rendered with the model's chat template on the worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z_][\w-]*$")]
    #: A string, or OpenAI's list of content parts (``[{"type": "text", "text": "..."}]``),
    #: whose text parts are joined with newlines; other part types (image, audio, file) are
    #: refused: the models served take text.
    content: Annotated[str, Field(strict=True)]

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, value: Any) -> Any:
        return join_content_parts(value)


def join_content_parts(value: Any) -> Any:
    """A message's content as one string: a string as is, a list of text parts joined with
    newlines. Anything else is returned untouched for the string check to refuse."""
    if not isinstance(value, list):
        return value
    texts: list[str] = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ValueError(f"content[{i}] must be a string or a part object with a 'type' "
                             "(e.g. {'type': 'text', 'text': '...'})")
        if kind not in TEXT_PARTS:
            raise PydanticCustomError(
                UNSUPPORTED, "content[{index}]: content part type '{kind}' is not supported: "
                "the models served take text only (send 'text' parts)",
                {"index": i, "kind": kind})
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"content[{i}]: a {kind!r} part needs a string 'text'")
        texts.append(text)
    return "\n".join(texts)


class GenerationParams(BaseModel):
    """``params`` of a ``generate`` request. ``temperature`` 0 (the default) is greedy decoding,
    which is deterministic; with sampling, ``seed`` makes the draw reproducible (without one, the
    worker derives a seed from the request id). A retried or reclaimed request goes on from the
    tokens already in its stream, whatever it would draw now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS_LIMIT, strict=True)] = 128
    temperature: Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)] = 0.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(ge=0, le=1_000_000, strict=True)] = 0
    seed: Annotated[int, Field(ge=0, le=SEED_MAX, strict=True)] | None = None
    stop: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] = Field(default_factory=list)
    #: Keep generating past the end-of-sequence token (benchmarks, tests: exact lengths).
    ignore_eos: Annotated[bool, Field(strict=True)] = False
    #: transformers' ``RepetitionPenaltyLogitsProcessor`` over the prompt and the tokens so
    #: far: a seen token's logit is divided by it when positive, multiplied when negative.
    #: 1.0 is none.
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)] = 1.0
    #: transformers' ``MinPLogitsWarper`` (after temperature, top-k, top-p): drop tokens whose
    #: probability is below ``min_p`` times the top token's. Sampling only; 0 is none.
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    #: transformers' ``MinNewTokensLengthLogitsProcessor``: the end-of-sequence tokens and
    #: ``stop_token_ids`` cannot be generated before this many tokens (stop strings still apply).
    min_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS_LIMIT, strict=True)] = 0
    #: More token ids that end the generation (finish reason ``stop``), as the end-of-sequence
    #: token does: the token is not part of the text.
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=TOKEN_ID_MAX, strict=True)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] = Field(default_factory=list)
    #: Return each generated token's log-probability (of the model's raw distribution, before
    #: penalties, temperature and filters, as vLLM's default), and the ``top_logprobs`` most
    #: likely alternatives at each position.
    logprobs: Annotated[bool, Field(strict=True)] = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS, strict=True)] = 0

    @field_validator("temperature", "top_p", "repetition_penalty", "min_p", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> GenerationParams:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: list[str]) -> list[str]:
        for s in value:
            if not 1 <= len(s) <= MAX_STOP_CHARS:
                raise ValueError(f"each stop string must have 1..{MAX_STOP_CHARS} characters, "
                                 f"got {s!r}")
        return value

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processed(self) -> bool:
        """Whether the logits go through more than temperature/top-k/top-p (per-row work)."""
        return self.repetition_penalty != 1.0 or self.min_tokens > 0

    @property
    def extended(self) -> bool:
        """Whether it asks for what only the continuous-batching engine does."""
        return (self.processed or self.min_p > 0.0 or bool(self.stop_token_ids)
                or self.logprobs)


class ScoreParams(BaseModel):
    """``params`` of a ``score`` request (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_generation_params(params: Any) -> GenerationParams:
    try:
        return GenerationParams.model_validate(params or {})
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic("invalid generate params: params.", exc) from exc


def parse_score_params(params: Any) -> ScoreParams:
    try:
        return ScoreParams.model_validate(params or {})
    except PydanticValidationError as exc:
        raise ValidationError.from_pydantic("invalid score params: params.", exc) from exc


def check_task_params(task: str, params: Any, has_messages: bool) -> None:
    """Producer- and worker-side check of a request's params for the LM tasks (others pass)."""
    if task == GENERATE_TASK:
        parse_generation_params(params)
    elif task == SCORE_TASK:
        parse_score_params(params)
        if has_messages:
            raise ValidationError("messages: the score task takes a plain prompt")
