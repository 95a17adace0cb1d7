"""The envelope of a batch's input file, checked whole at create (a 400 naming the first bad
line): each line within the per-line limit, JSON, a unique ``custom_id``, ``method`` POST,
``url`` equal to the batch's endpoint, a ``body`` naming the same model as line 1. Reading
JSONL in bounded memory.
Free of the gateway's imports: the gateway's app imports it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from inferq.protocol.generation import GENERATE_TASK

#: endpoint -> the queue task its lines run as
TASKS: dict[str, str] = {"/v1/embeddings": "embed", "/v1/chat/completions": GENERATE_TASK,
                         "/v1/completions": GENERATE_TASK}
MAX_CUSTOM_ID = 512


class FileInvalid(Exception):
    """The input file cannot make a batch: ``line`` (1-based) says where."""

    def __init__(self, line: int | None, code: str, message: str) -> None:
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
        self.line = line
        self.code = code
        self.message = where + message


def read_lines(blocks: Iterable[bytes], offset: int = 0,
               max_line: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(byte offset after the line, line)`` for each line of the stream of blocks (a final
    line without its newline included), starting at file offset ``offset``.

    With ``max_line``, a line longer than that many bytes (its newline not counted) raises
    ``FileInvalid`` naming it (1-based from ``offset``) as soon as that many bytes of it have
    been read: memory stays within ``max_line`` plus one block however long the line is."""
    rest = b""
    position = offset
    number = 0
    for block in blocks:
        data = rest + block
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            number += 1
            if max_line is not None and end - start > max_line:
                raise line_too_long(number, max_line)
            position += end + 1 - start
            yield position, data[start:end]
            start = end + 1
        rest = data[start:]
        if max_line is not None and len(rest) > max_line:
            raise line_too_long(number + 1, max_line)
    if rest:
        yield position + len(rest), rest


def line_too_long(number: int, max_line: int) -> FileInvalid:
    return FileInvalid(number, "line_too_long",
                       f"longer than the limit of {max_line} bytes per line")


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


def check_file(blocks: Iterable[bytes], endpoint: str, max_lines: int,
               max_line_bytes: int | None = None) -> tuple[int, str]:
    """Every line's envelope: at most ``max_line_bytes`` (read in bounded memory), JSON, a
    unique ``custom_id``, ``method`` POST, ``url`` equal to ``endpoint``, a ``body`` with the
    same ``model`` as the first line. The line count and the model, or ``FileInvalid`` naming
    the first bad line."""
    seen: set[str] = set()
    model: str | None = None
    number = 0
    for number, (_, raw) in enumerate(read_lines(blocks, max_line=max_line_bytes), start=1):
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


