"""Parameters of the ``generate`` and ``score`` tasks, and the shape of their outputs.

Pure pydantic (no torch): the producer SDK validates a request's params with these models before
queueing it, and the worker validates them again before running it. Every error names the field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

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
MAX_STOP_TOKEN_IDS = 16
TOKEN_ID_MAX = (1 << 31) - 1


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
    content: Annotated[str, Field(strict=True)]


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
    #: vLLM's sampling options (``inferq worker --engine vllm``; the transformers engine refuses
    #: a value other than the default, see ``inferq.worker.generate.vllm.sampling``): drop
    #: tokens below ``min_p`` x the top token's probability; stop at any of these token ids;
    #: penalise tokens already in the prompt or output (1.0: none).
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=TOKEN_ID_MAX, strict=True)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] = Field(
                                  default_factory=list)
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)] = 1.0

    @field_validator("temperature", "top_p", "min_p", "repetition_penalty", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {type(value).__name__}")
        return value

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
