"""A result as the OpenAI response body: one builder per endpoint (``chat_response``,
``completion_response``, ``embeddings_body``), used by the gateway's routes and the batch
runner alike. A result whose output is not what the endpoint makes raises ``ApiError`` 502
``invalid_output``."""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from inferq.openai.errors import ApiError
from inferq.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    CompletionUsage,
)
from inferq.protocol.codec import Result
from inferq.protocol.cost import estimate_tokens
from inferq.protocol.generation import FinishReason

# --- generation ----------------------------------------------------------------------------

def response_id(chat: bool, request_id: str) -> str:
    """The ``id`` of a response (and of its stream's chunks)."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"


def finish_reason(result: Result) -> Literal["stop", "length"]:
    return "length" if result.finish_reason is FinishReason.LENGTH else "stop"


def usage_of(result: Result) -> CompletionUsage:
    prompt = result.usage.prompt_tokens if result.usage is not None else 0
    completion = result.usage.completion_tokens if result.usage is not None else 0
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion,
                           total_tokens=prompt + completion)


def text_of(result: Result, model: str) -> str:
    output = result.output
    text = output.get("text") if isinstance(output, dict) else None
    if not isinstance(text, str):
        raise ApiError(502, "upstream_error", "invalid_output",
                       f"model {model!r} returned a {type(output).__name__}, not a generation "
                       "(no 'text'): is it a generate worker?", request_id=result.id)
    return text


def chat_logprobs(output: Any) -> dict[str, Any] | None:
    """The worker's per-token log-probabilities in the chat completion's shape."""
    entries = output.get("logprobs") if isinstance(output, dict) else None
    if not isinstance(entries, list):
        return None

    def item(e: Mapping[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"],
                "bytes": list(str(e["token"]).encode("utf-8"))}

    return {"content": [{**item(e), "top_logprobs": [item(t) for t in e["top"]]}
                        for e in entries], "refusal": None}


def completion_logprobs(output: Any) -> dict[str, Any] | None:
    """The worker's per-token log-probabilities in the (legacy) completion's shape."""
    entries = output.get("logprobs") if isinstance(output, dict) else None
    if not isinstance(entries, list):
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top"]} for e in entries],
            "text_offset": offsets}


def chat_response(id: str, created: int, model: str, result: Result) -> ChatCompletionResponse:
    """``POST /v1/chat/completions``'s body for a finished ``generate`` result."""
    return ChatCompletionResponse(
        id=id, created=created, model=model, usage=usage_of(result),
        choices=[ChatChoice(message=AssistantMessage(content=text_of(result, model)),
                            finish_reason=finish_reason(result),
                            logprobs=chat_logprobs(result.output))])


def completion_response(id: str, created: int, model: str, result: Result) -> CompletionResponse:
    """``POST /v1/completions``'s body for a finished ``generate`` result."""
    return CompletionResponse(
        id=id, created=created, model=model, usage=usage_of(result),
        choices=[CompletionChoice(text=text_of(result, model),
                                  finish_reason=finish_reason(result),
                                  logprobs=completion_logprobs(result.output))])


# --- embeddings ----------------------------------------------------------------------------

def encode_base64(vector: list[float]) -> str:
    """What OpenAI sends for ``encoding_format=base64``: little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


_NUMBER_TYPES = frozenset({float, int})


def as_vector(output: Any, index: int, model: str) -> list[float]:
    # ``set(map(type, ...))`` runs in C: a per-element generator cost ~0.3 ms per vector.
    if isinstance(output, list) and output and set(map(type, output)) <= _NUMBER_TYPES:
        return output
    raise ApiError(502, "upstream_error", "invalid_output",
                   f"model {model!r} returned a {type(output).__name__} for input {index}, "
                   "not a vector of numbers: is it an embedding model?",
                   param=f"input[{index}]")


def embeddings_tokens(text_bytes: Sequence[int]) -> int:
    """The estimated ``usage`` of inputs of these sizes (UTF-8 bytes): the protocol's one
    token estimate (``cost.estimate_tokens``), which fair shares and limits count with."""
    return sum(estimate_tokens(n) for n in text_bytes)


def embeddings_body(model: str, outputs: Sequence[Any], tokens: int,
                    b64: bool) -> dict[str, Any]:
    """``POST /v1/embeddings``'s body (``EmbeddingsResponse``'s shape) for the outputs of its
    inputs' ``embed`` requests, in order. Results carry no token counts, so ``tokens`` (the
    ``usage``) is an ESTIMATE, not the worker tokenizer's count: ``embeddings_tokens``
    (responses say so in the ``X-Inferq-Usage: estimated`` header). A plain dict, encoded in
    one pass (``jsonenc``): pydantic would re-validate every float."""
    data = []
    for i, output in enumerate(outputs):
        vector = as_vector(output, i, model)
        data.append({"object": "embedding", "index": i,
                     "embedding": encode_base64(vector) if b64 else vector})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
