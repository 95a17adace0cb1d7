"""OpenAI's Files API: ``POST /v1/files`` (multipart ``file`` and ``purpose``), ``GET
/v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE
/v1/files/{id}``. The objects are OpenAI's, so its client works unchanged."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from inferq.batch.files import PURPOSES, content_name
from inferq.gateway.batch_state import BatchDep
from inferq.gateway.caller import Caller
from inferq.gateway.schemas import ERROR_RESPONSES
from inferq.openai.errors import INVALID, ApiError

router = APIRouter(tags=["files"])


def not_found(file_id: str) -> ApiError:
    return ApiError(404, INVALID, "not_found", f"No such File object: {file_id}", param="id")


@router.post("/v1/files", responses=ERROR_RESPONSES, summary="Upload a file (OpenAI Files API)")
async def upload_file(state: BatchDep, caller: Caller, file: Annotated[UploadFile, File()],
                      purpose: Annotated[str, Form()]) -> dict[str, Any]:
    """Stored in the gateway's file store; ``purpose="batch"`` makes it a batch input. At
    most ``INFERQ_GATEWAY_MAX_FILE_BYTES`` (512 MB, OpenAI's limit)."""
    if purpose not in PURPOSES:
        raise ApiError(400, INVALID, "invalid_request", f"purpose must be one of "
                       f"{list(PURPOSES)}, got {purpose!r}", param="purpose")
    limit = state.batches.config.max_file_bytes
    made = await state.files.upload(file.filename or "upload", purpose, file.file, limit,
                                    caller.tenant)
    if made is None:
        raise ApiError(400, INVALID, "file_too_large",
                       f"the file is larger than the limit of {limit} bytes", param="file")
    return made


@router.get("/v1/files", responses=ERROR_RESPONSES, summary="List files")
async def list_files(state: BatchDep, caller: Caller, purpose: str | None = None,
                     after: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                     order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    data, more = await state.files.list(after=after, limit=limit, purpose=purpose,
                                        newest_first=order == "desc", caller=caller)
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@router.get("/v1/files/{file_id}", responses=ERROR_RESPONSES, summary="Retrieve a file")
async def get_file(state: BatchDep, caller: Caller, file_id: str) -> dict[str, Any]:
    found = await state.files.get(file_id, caller)
    if found is None:
        raise not_found(file_id)
    return found


@router.get("/v1/files/{file_id}/content", responses=ERROR_RESPONSES,
            summary="Retrieve a file's content")
async def file_content(state: BatchDep, caller: Caller, file_id: str) -> StreamingResponse:
    """Streamed from the file store in blocks (bounded memory whatever the size)."""
    found = await state.files.get(file_id, caller)
    if found is None:
        raise not_found(file_id)
    blocks = state.files.store.blocks(content_name(file_id))
    return StreamingResponse(blocks, media_type="application/octet-stream",
                             headers={"Content-Length": str(found["bytes"])})


@router.delete("/v1/files/{file_id}", responses=ERROR_RESPONSES, summary="Delete a file")
async def delete_file(state: BatchDep, caller: Caller, file_id: str) -> dict[str, Any]:
    if not await state.files.delete(file_id, caller):
        raise not_found(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
