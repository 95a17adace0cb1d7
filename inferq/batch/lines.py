"""The lines of a batch: reading a JSONL file in bounded memory, the checks that refuse a
whole file (at create), the checks that refuse one line (at ingestion: a 4xx line in the
error file), and the lines of the output and error files.

An input line is OpenAI's ``{"custom_id", "method": "POST", "url", "body"}``; ``body`` is
what the endpoint takes online. Limits of inferq: one batch serves one model (like OpenAI's),
an embeddings line has one input (a string or a list of one string), and no line streams.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pydantic

from inferq.errors import RequestError
from inferq.gateway.errors import ApiError, from_inferq
from inferq.gateway.routes.completions import finish_reason, text_of, usage_of
from inferq.gateway.routes.openai_compat import as_vector, encode_base64, estimate_tokens
from inferq.gateway.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    EmbeddingsRequest,
)
from inferq.producer.common import raise_for_status
from inferq.protocol.codec import Result, Status
from inferq.protocol.generation import GENERATE_TASK

#: endpoint -> (task, body model)
ENDPOINTS: dict[str, tuple[str, type[pydantic.BaseModel]]] = {
    "/v1/embeddings": ("embed", EmbeddingsRequest),
    "/v1/chat/completions": (GENERATE_TASK, ChatCompletionRequest),
    "/v1/completions": (GENERATE_TASK, CompletionRequest),
}
MAX_CUSTOM_ID = 512


class FileInvalid(Exception):
    """The input file cannot make a batch: ``line`` (1-based) says where."""

    def __init__(self, line: int | None, code: str, message: str) -> None:
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
        self.line = line
        self.code = code
        self.message = where + message


def read_lines(blocks: Iterable[bytes], offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(byte offset after the line, line)`` for each line of the stream of blocks (a final
    line without its newline included), starting at file offset ``offset``."""
    rest = b""
    position = offset
    for block in blocks:
        data = rest + block
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            position += end + 1 - start
            yield position, data[start:end]
            start = end + 1
        rest = data[start:]
    if rest:
        yield position + len(rest), rest


def line_request_id(batch_id: str, custom_id: str) -> str:
    """The queue id of a line: the same batch and custom_id always give the same id."""
    return f"{batch_id}-{hashlib.sha256(custom_id.encode()).hexdigest()[:24]}"


def _object(raw: bytes, number: int) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FileInvalid(number, "invalid_json_line",
                          f"not a JSON object (the file must be JSONL): {exc}") from exc
    if not isinstance(value, dict):
        raise FileInvalid(number, "invalid_json_line",
                          f"not a JSON object (the file must be JSONL), got "
                          f"{type(value).__name__}")
    return value


def check_file(blocks: Iterable[bytes], endpoint: str, max_lines: int) -> tuple[int, str]:
    """Every line's envelope: JSON, a unique ``custom_id``, ``method`` POST, ``url`` equal to
    ``endpoint``, a ``body`` with the same ``model`` as the first line. The line count and
    the model, or ``FileInvalid`` naming the first bad line."""
    seen: set[str] = set()
    model: str | None = None
    number = 0
    for number, (_, raw) in enumerate(read_lines(blocks), start=1):
        if number > max_lines:
            raise FileInvalid(number, "too_many_lines",
                              f"a batch has at most {max_lines} lines")
        line = _object(raw, number)
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
            raise FileInvalid(number, "invalid_custom_id",
                              f"custom_id must be a string of 1..{MAX_CUSTOM_ID} characters")
        if custom_id in seen:
            raise FileInvalid(number, "duplicate_custom_id",
                              f"duplicate custom_id {custom_id!r}")
        seen.add(custom_id)
        if line.get("method") != "POST":
            raise FileInvalid(number, "invalid_method", "method must be POST")
        if line.get("url") != endpoint:
            raise FileInvalid(number, "mismatched_url",
                              f"url {line.get('url')!r} is not the batch's endpoint "
                              f"{endpoint!r}")
        body = line.get("body")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise FileInvalid(number, "invalid_body", "body must be an object with a model")
        if model is None:
            model = body["model"]
        elif body["model"] != model:
            raise FileInvalid(number, "mismatched_model",
                              f"model {body['model']!r} differs from line 1's {model!r}: a "
                              "batch serves one model")
    if model is None:
        raise FileInvalid(None, "empty_file", "the file has no lines")
    return number, model


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
        texts = [body.input] if isinstance(body.input, str) else body.input
        if len(texts) != 1:
            return LineRefused(custom_id, ApiError(
                400, "invalid_request_error", "invalid_request",
                f"input: a batch line embeds one text, got {len(texts)}", param="input"))
        return LineRequest(custom_id, texts[0], {"model": body.model, "task": "embed"},
                           [custom_id, body.encoding_format == "base64",
                            estimate_tokens(texts[0])])
    assert isinstance(body, ChatCompletionRequest | CompletionRequest)
    if body.stream:
        return LineRefused(custom_id, ApiError(400, "invalid_request_error", "invalid_request",
                                               "stream: a batch line cannot stream",
                                               param="stream"))
    request: dict[str, Any] = {"model": body.model, "task": GENERATE_TASK,
                               "params": body.params()}
    if isinstance(body, ChatCompletionRequest):
        request["messages"] = [m.model_dump() for m in body.messages]
        prompt = ""
    else:
        prompt = body.prompt
    return LineRequest(custom_id, prompt, request, [custom_id, False, 0])


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


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
    """The body the online endpoint would have answered (raises ``ApiError`` when the
    output is not what the endpoint makes)."""
    if endpoint == "/v1/embeddings":
        vector = as_vector(result.output, 0, model)
        tokens = int(meta[2])
        return {"object": "list", "model": model,
                "data": [{"object": "embedding", "index": 0,
                          "embedding": encode_base64(vector) if meta[1] else vector}],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if endpoint == "/v1/chat/completions":
        return ChatCompletionResponse(
            id=f"chatcmpl-{result.id}", created=created, model=model, usage=usage_of(result),
            choices=[ChatChoice(message=AssistantMessage(content=text_of(result, model)),
                                finish_reason=finish_reason(result))]).model_dump()
    return CompletionResponse(
        id=f"cmpl-{result.id}", created=created, model=model, usage=usage_of(result),
        choices=[CompletionChoice(text=text_of(result, model),
                                  finish_reason=finish_reason(result))]).model_dump()


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
