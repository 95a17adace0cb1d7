"""OpenAI's Batches API: ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches``
(``after``, ``limit``), ``POST /v1/batches/{id}/cancel``; and ``GET /v1/batches/stats``
(inferq's: batches by status, lines by outcome, the active batches' progress).

A batch belongs to the caller's tenant: another tenant gets the same 404 as for a batch that
does not exist (get, cancel), and lists and stats show a tenant its own batches only; the
operator and admin keys see every batch. Its lines run as the owner's requests (its tenant,
ids in its name space) within the creating key's priority ceiling."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from inferq.batch.batches import BatchRefused
from inferq.batch.envelope import FileInvalid
from inferq.gateway.batch_state import BatchDep
from inferq.gateway.caller import Caller
from inferq.gateway.schemas import ERROR_RESPONSES
from inferq.gateway.tracecontext import incoming
from inferq.openai.errors import INVALID, ApiError

router = APIRouter(tags=["batches"])


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None


def refused(exc: BatchRefused) -> ApiError:
    kind = {403: "permission_error", 404: "not_found_error",
            409: "conflict_error"}.get(exc.status, INVALID)
    return ApiError(exc.status, kind, exc.code, exc.message, param=exc.param)


@router.post("/v1/batches", responses=ERROR_RESPONSES, summary="Create a batch")
async def create_batch(state: BatchDep, caller: Caller, body: CreateBatch) -> dict[str, Any]:
    """Checks the whole input file first: a line longer than the per-line limit, not JSON,
    with a ``url`` other than ``endpoint``, a repeated ``custom_id`` or another model is a 400
    naming the line. A ``metadata.priority`` above the key's ``max_priority`` is a 403."""
    try:
        return await state.batches.create(body.input_file_id, body.endpoint,
                                          body.completion_window, body.metadata, caller,
                                          incoming())
    except BatchRefused as exc:
        raise refused(exc) from exc
    except FileInvalid as exc:
        raise ApiError(400, INVALID, exc.code, exc.message,
                       param=None if exc.line is None else f"line {exc.line}") from exc
    except FileNotFoundError as exc:  # metadata without content: the store lost it
        raise ApiError(400, INVALID, "file_missing", f"the content of {body.input_file_id} "
                       "is not in the file store", param="input_file_id") from exc


@router.get("/v1/batches/stats", responses=ERROR_RESPONSES, summary="Batch statistics")
async def batch_stats(state: BatchDep, caller: Caller) -> dict[str, Any]:
    return await state.batches.stats(caller)


@router.get("/v1/batches/{batch_id}", responses=ERROR_RESPONSES, summary="Retrieve a batch")
async def get_batch(state: BatchDep, caller: Caller, batch_id: str) -> dict[str, Any]:
    found = await state.batches.get(batch_id, caller)
    if found is None:
        raise ApiError(404, "not_found_error", "not_found", f"No such Batch: {batch_id}",
                       param="id")
    return found


@router.get("/v1/batches", responses=ERROR_RESPONSES, summary="List batches")
async def list_batches(state: BatchDep, caller: Caller, after: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    data, more = await state.batches.list(after, limit, caller)
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@router.post("/v1/batches/{batch_id}/cancel", responses=ERROR_RESPONSES,
             summary="Cancel a batch")
async def cancel_batch(state: BatchDep, caller: Caller, batch_id: str) -> dict[str, Any]:
    """``cancelling`` at once; the waiting lines are withdrawn from the queue, running ones
    finish; then ``cancelled``, with the finished lines in its output file."""
    try:
        return await state.batches.cancel(batch_id, caller)
    except BatchRefused as exc:
        raise refused(exc) from exc
