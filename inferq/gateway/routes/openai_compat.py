"""OpenAI-compatible routes: ``POST /v1/embeddings`` (the official ``openai`` client works
against it). ``/v1/chat/completions`` and ``/v1/completions`` are in ``completions``."""

from __future__ import annotations

import base64
import math
import struct
import uuid
from typing import Any

from fastapi import APIRouter, Response

from inferq.errors import QueueFull
from inferq.gateway.caller import Caller, check_priority, tenant_of
from inferq.gateway.errors import ApiError, from_inferq
from inferq.gateway.jsonenc import dumps
from inferq.gateway.limiting import reserve
from inferq.gateway.routes.common import (
    DeadlineHeader,
    InputFailed,
    PriorityHeader,
    TenantHeader,
    TimeoutHeader,
    wait_all,
)
from inferq.gateway.schemas import ERROR_RESPONSES, EmbeddingsRequest, EmbeddingsResponse
from inferq.gateway.state import GatewayState, State, cancel_quietly
from inferq.gateway.tracecontext import trace_fields
from inferq.tenancy.principal import Principal

router = APIRouter(tags=["openai"])

#: Results carry no token counts, so ``usage`` is an ESTIMATE, not the worker tokenizer's
#: count: OpenAI's rule of thumb of about 4 characters per token (English text). Responses
#: say so in the ``X-Inferq-Usage: estimated`` header.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


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


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=ERROR_RESPONSES,
             summary="Create embeddings (OpenAI-compatible)")
async def create_embeddings(body: EmbeddingsRequest, state: State, caller: Caller,
                            x_priority: PriorityHeader = None,
                            x_deadline_s: DeadlineHeader = None,
                            x_timeout_s: TimeoutHeader = None,
                            x_inferq_tenant: TenantHeader = None) -> Response:
    """Queues every input (task ``embed``) in one round trip and waits for all of them. If one
    fails or the wait times out, the others are cancelled and the call fails as a whole."""
    return await embeddings_response(state, body, caller, x_priority, x_deadline_s, x_timeout_s,
                                     x_inferq_tenant)


async def embeddings_response(state: GatewayState, body: EmbeddingsRequest, caller: Principal,
                              x_priority: int | None = None, x_deadline_s: float | None = None,
                              x_timeout_s: float | None = None,
                              x_tenant: str | None = None) -> Response:
    """The work of ``POST /v1/embeddings``, shared by the route and the gateway's fast path
    (``inferq.gateway.fastpath``): raises ``ApiError`` or an ``InferqError`` on failure."""
    settings = state.settings
    texts = [body.input] if isinstance(body.input, str) else body.input
    if len(texts) > settings.max_embedding_inputs:
        raise ApiError(422, "invalid_request_error", "invalid_request",
                       f"input: at most {settings.max_embedding_inputs} texts per call, "
                       f"got {len(texts)}", param="input")
    max_bytes = state.client.options.limits.max_prompt_bytes
    for i, text in enumerate(texts):
        if len(text.encode("utf-8")) > max_bytes:
            raise ApiError(422, "invalid_request_error", "payload_too_large",
                           f"input[{i}]: longer than {max_bytes} bytes", param=f"input[{i}]")
    timeout = state.timeout(x_timeout_s, "X-Timeout-S")
    priority = check_priority(caller, body.priority if body.priority is not None else (
        x_priority if x_priority is not None else caller.default_priority))
    deadline_s = body.deadline_s if body.deadline_s is not None else x_deadline_s
    await state.require_served("embed", body.model)
    # Reservations of the call's own (its requests' ids are made when they are queued).
    call = uuid.uuid4().hex
    reservation = await reserve(
        state.client.redis, caller,
        [f"{call}:{i}" for i in range(len(texts))] if caller.limited else [],
        text_bytes=sum(len(t.encode("utf-8")) for t in texts), timeout_s=timeout,
        namespace=settings.namespace)
    try:
        handles = await state.enqueue_many(
            texts, model=body.model, task="embed", priority=priority, deadline_s=deadline_s,
            tenant=tenant_of(caller, state.tenant(body.user, x_tenant)), **trace_fields())
    except QueueFull as exc:
        # Some inputs may have got in before the queue filled: all or nothing.
        await cancel_quietly(exc.accepted)
        await reservation.release()
        raise
    except BaseException:
        await reservation.release()
        raise
    try:
        results = await wait_all(handles, timeout)
    except InputFailed as exc:
        await reservation.release()
        raise from_inferq(exc.error, param=f"input[{exc.index}]") from exc
    except BaseException:
        await reservation.release()
        raise
    await reservation.settle(results)
    b64 = body.encoding_format == "base64"
    data = []
    for i, result in enumerate(results):
        vector = as_vector(result.output, i, body.model)
        data.append({"object": "embedding", "index": i,
                     "embedding": encode_base64(vector) if b64 else vector})
    tokens = sum(estimate_tokens(t) for t in texts)
    # The shape of ``EmbeddingsResponse``, encoded here in one pass (orjson when installed):
    # FastAPI would re-validate every float, pydantic's encoder is slower on float lists.
    response = {"object": "list", "data": data, "model": body.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return Response(dumps(response), media_type="application/json",
                    headers={"X-Inferq-Usage": "estimated", **reservation.headers})
