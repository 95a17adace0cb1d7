"""The lines of a batch: the checks that refuse one line (at ingestion: a 4xx line in the
error file, the batch goes on) and the lines of the output and error files. The checks that
refuse a whole file are ``envelope``'s.

An input line is OpenAI's ``{"custom_id", "method": "POST", "url", "body"}``; ``body`` is
what the endpoint takes online. Limits of inferq: one batch serves one model (like OpenAI's),
an embeddings line has one input (a string or a list of one string), and no line streams.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pydantic

from inferq.errors import RequestError
from inferq.openai.errors import ApiError, from_inferq
from inferq.openai.jsonenc import dumps
from inferq.openai.requests import (
    EMBED_TASK,
    embedding_texts,
    embeddings_fields,
    generation_request,
)
from inferq.openai.responses import (
    chat_response,
    completion_response,
    embeddings_body,
    embeddings_tokens,
    response_id,
)
from inferq.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest
from inferq.producer.replies import raise_for_status
from inferq.protocol.codec import Result, Status
from inferq.protocol.generation import GENERATE_TASK

#: endpoint -> (task, body model)
ENDPOINTS: dict[str, tuple[str, type[pydantic.BaseModel]]] = {
    "/v1/embeddings": (EMBED_TASK, EmbeddingsRequest),
    "/v1/chat/completions": (GENERATE_TASK, ChatCompletionRequest),
    "/v1/completions": (GENERATE_TASK, CompletionRequest),
}


@dataclass(frozen=True, slots=True)
class LineRequest:
    """A valid line, as the keyword arguments of ``enqueue`` (less the batch's own)."""

    custom_id: str
    prompt: str
    enqueue: dict[str, Any]
    #: What the result needs to become the response body: [custom_id, base64?, tokens].
    meta: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LineRefused:
    custom_id: str
    error: ApiError


def parse_line(raw: bytes, endpoint: str) -> LineRequest | LineRefused:
    """One line (its envelope was checked at create) as a request, or refused with the 4xx
    the endpoint would have answered online."""
    line = json.loads(raw)
    custom_id: str = line["custom_id"]
    _, schema = ENDPOINTS[endpoint]
    try:
        body = schema.model_validate(line["body"])
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return LineRefused(custom_id, ApiError(400, "invalid_request_error", "invalid_request",
                                               problems))
    if isinstance(body, EmbeddingsRequest):
        texts = embedding_texts(body)
        if len(texts) != 1:
            return LineRefused(custom_id, ApiError(
                400, "invalid_request_error", "invalid_request",
                f"input: a batch line embeds one text, got {len(texts)}", param="input"))
        return LineRequest(custom_id, texts[0], embeddings_fields(body),
                           [custom_id, body.encoding_format == "base64",
                            embeddings_tokens([len(texts[0].encode("utf-8"))])])
    assert isinstance(body, ChatCompletionRequest | CompletionRequest)
    if body.stream:
        return LineRefused(custom_id, ApiError(400, "invalid_request_error", "invalid_request",
                                               "stream: a batch line cannot stream",
                                               param="stream"))
    request = generation_request(body)
    return LineRequest(custom_id, request.prompt, request.fields, [custom_id, False, 0])


def _json(value: Any) -> bytes:
    # orjson (the gateway's encoder): the vectors of an embeddings batch are most of the bytes
    return dumps(value) + b"\n"


def response_line(request_id: str, custom_id: str, status_code: int,
                  body: dict[str, Any]) -> bytes:
    """A line of the output file (2xx) or of the error file (4xx/5xx): OpenAI's shape."""
    return _json({"id": f"batch_req_{request_id}", "custom_id": custom_id,
                  "response": {"status_code": status_code, "request_id": request_id,
                               "body": body}, "error": None})


def error_line(request_id: str, custom_id: str, code: str, message: str) -> bytes:
    """A line of the error file with no response (it never ran): ``expired``."""
    return _json({"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": None,
                  "error": {"code": code, "message": message}})


def ok_body(endpoint: str, model: str, result: Result, meta: list[Any],
            created: int) -> dict[str, Any]:
    """The body the online endpoint would have answered, made by the same builders
    (``inferq.openai.responses``; raises ``ApiError`` when the output is not what the
    endpoint makes)."""
    if endpoint == "/v1/embeddings":
        return embeddings_body(model, [result.output], int(meta[2]), bool(meta[1]))
    if endpoint == "/v1/chat/completions":
        return chat_response(response_id(True, result.id), created, model,
                             result).model_dump()
    return completion_response(response_id(False, result.id), created, model,
                               result).model_dump()


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where a finished line goes: ``kind`` is completed, failed or expired."""

    kind: str
    line: bytes


def outcome(endpoint: str, model: str, result: Result, meta: list[Any],
            created: int) -> Outcome:
    custom_id = str(meta[0])
    if result.status is Status.EXPIRED:
        message = result.error.message if result.error else "the deadline passed"
        return Outcome("expired", error_line(result.id, custom_id, "expired", message))
    try:
        body = ok_body(endpoint, model, raise_for_status(result), meta, created)
    except ApiError as exc:
        exc.request_id = result.id
        return Outcome("failed", response_line(result.id, custom_id, exc.status, exc.body()))
    except RequestError as exc:
        error = from_inferq(exc)
        return Outcome("failed", response_line(result.id, custom_id, error.status,
                                               error.body()))
    return Outcome("completed", response_line(result.id, custom_id, 200, body))
