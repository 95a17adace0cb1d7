"""Files (OpenAI's Files API, ``purpose="batch"`` and the ``batch_output`` files a batch
writes): contents in the ``FileStore``, metadata in Redis (one hash per file and an index by
creation time, in one slot, written in one transaction).

Every file has an owner: the tenant of the principal that uploaded it (a batch's output and
error files: the batch's owner), '' for the operator. A caller that does not ``own`` a file
(``Principal.owns``: its own tenant's, or every one for the operator and admin keys) is
answered as if it did not exist: None here, a 404 in the routes; a tenant's list reads its own
index (``Index.files_of``), so it neither sees nor pages through the others'."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import IO, TYPE_CHECKING, Any

from inferq.batch.keys import Index
from inferq.tenancy.principal import Principal

if TYPE_CHECKING:  # fsspec is the gateway's: ``inferq stats`` reads batches without it
    from inferq.batch.store import FileStore

#: OpenAI's purposes; a batch's input must be ``batch``, its outputs are ``batch_output``.
PURPOSES = ("assistants", "assistants_output", "batch", "batch_output", "fine-tune",
            "fine-tune-results", "vision", "user_data", "evals")
_FIELDS = ("filename", "bytes", "created_at", "purpose", "owner")
#: Who the services act for when a caller names none: the operator (every tenant's objects).
OPERATOR = Principal.operator()


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def content_name(file_id: str) -> str:
    return f"files/{file_id}"


def file_object(file_id: str, filename: str, size: int, created_at: int,
                purpose: str) -> dict[str, Any]:
    """OpenAI's ``FileObject``."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at,
            "filename": filename, "purpose": purpose, "status": "processed",
            "status_details": None, "expires_at": None}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Files:
    def __init__(self, redis: Any, store: FileStore, index: Index) -> None:
        self.redis = redis
        self.store = store
        self.index = index

    async def upload(self, filename: str, purpose: str, source: IO[bytes], max_bytes: int,
                     owner: str | None = None) -> dict[str, Any] | None:
        """Store the upload, owned by the tenant ``owner``; None (nothing kept) when it is
        larger than ``max_bytes``."""
        file_id = new_file_id()
        size = await asyncio.to_thread(self.store.copy_from, content_name(file_id), source,
                                       max_bytes)
        if size is None:
            return None
        return await self.record(file_id, filename, purpose, size, owner)

    async def record(self, file_id: str, filename: str, purpose: str, size: int,
                     owner: str | None = None) -> dict[str, Any]:
        """Write (or rewrite, the same) metadata of a stored file."""
        now = time.time()
        known = await self.get(file_id)
        created = known["created_at"] if known is not None else int(now)
        order = {file_id: int(now * 1000)}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.index.file(file_id), mapping={
                "filename": filename, "bytes": size, "created_at": created, "purpose": purpose,
                "owner": owner or ""})
            pipe.zadd(self.index.files, order, nx=True)
            if owner:
                pipe.zadd(self.index.files_of(owner), order, nx=True)
            await pipe.execute()
        return file_object(file_id, filename, size, created, purpose)

    async def get(self, file_id: str, caller: Principal = OPERATOR) -> dict[str, Any] | None:
        """The file, or None when there is none ``caller`` may see."""
        values = await self.redis.hmget(self.index.file(file_id), *_FIELDS)
        if values[0] is None:
            return None
        filename, size, created, purpose, owner = (_text(v) if v is not None else ""
                                                   for v in values)
        if not caller.owns(owner or None):
            return None
        return file_object(file_id, filename, int(size), int(created), purpose)

    def _listed(self, caller: Principal) -> str:
        """The index ``caller`` lists: every file, or its tenant's."""
        if caller.sees_all or caller.tenant is None:
            return self.index.files
        return self.index.files_of(caller.tenant)

    async def list(self, *, after: str | None, limit: int, purpose: str | None,
                   newest_first: bool = True,
                   caller: Principal = OPERATOR) -> tuple[list[dict[str, Any]], bool]:
        """A page of the files ``caller`` may see (newest first by default), after the id
        ``after``; and whether more follow."""
        index = self._listed(caller)
        start = 0
        if after is not None:
            rank = await (self.redis.zrevrank(index, after) if newest_first
                          else self.redis.zrank(index, after))
            if rank is None:
                return [], False
            start = int(rank) + 1
        found: list[dict[str, Any]] = []
        more = False
        page = max(limit, 100)
        while True:
            ids = await self.redis.zrange(index, start, start + page - 1, desc=newest_first)
            if not ids:
                break
            for raw in ids:
                item = await self.get(_text(raw), caller)
                if item is None or (purpose is not None and item["purpose"] != purpose):
                    continue
                if len(found) == limit:
                    more = True
                    break
                found.append(item)
            if more or len(ids) < page:
                break
            start += page
        return found, more

    async def owner_of(self, file_id: str) -> str | None:
        """The tenant that owns the file (None: the operator's, or no such file)."""
        owner = await self.redis.hget(self.index.file(file_id), "owner")
        return _text(owner) or None if owner is not None else None

    async def delete(self, file_id: str, caller: Principal = OPERATOR) -> bool:
        """False when there is no file ``caller`` may see (nothing deleted)."""
        if await self.get(file_id, caller) is None:
            return False
        owner = await self.owner_of(file_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.index.file(file_id))
            pipe.zrem(self.index.files, file_id)
            if owner:
                pipe.zrem(self.index.files_of(owner), file_id)
            await pipe.execute()
        await asyncio.to_thread(self.store.delete, content_name(file_id))
        return True
