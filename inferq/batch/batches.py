"""The Batches API's operations on Redis: create (after checking the whole input file),
read, list and cancel. The work on a batch is the runner's (``runner``).

Every operation acts for a caller (a ``Principal``; the operator when none is named). A batch
belongs to its creator's tenant (``BatchField.OWNER``): another tenant gets None / 404 for
it, as if it did not exist (get, cancel), and lists and stats show a tenant its own only; the
operator and admin keys see every one. A batch needs an input file its caller may see. Its
lines inherit the owner's tenant and the creating key's ceiling on priority: a
``metadata.priority`` above the ceiling is a 403; the default priority is lowered to it."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from inferq import tracing
from inferq.batch import ops
from inferq.batch.config import BatchConfig
from inferq.batch.envelope import TASKS, check_file
from inferq.batch.fields import BatchField as B
from inferq.batch.files import OPERATOR, Files, content_name
from inferq.batch.keys import BatchKeys, Index
from inferq.batch.limits import limits_field
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN
from inferq.tenancy.principal import Principal

WINDOWS = {"24h": 24 * 3600}
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_TIMES = (B.CREATED_AT, B.IN_PROGRESS_AT, B.EXPIRES_AT, B.FINALIZING_AT, B.COMPLETED_AT,
          B.FAILED_AT, B.EXPIRED_AT, B.CANCELLING_AT, B.CANCELLED_AT)
_COUNTS = (B.TOTAL, B.CURSOR, B.INVALID, B.COMPLETED, B.FAILED, B.EXPIRED, B.WITHDRAWN)


class BatchRefused(Exception):
    """A batch that cannot be created or changed: ``status`` is the HTTP code."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode(raw: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def counts(h: dict[str, str]) -> dict[str, int]:
    return {f.value: int(h.get(f, 0) or 0) for f in _COUNTS}


def batch_object(batch_id: str, h: dict[str, str]) -> dict[str, Any]:
    """OpenAI's ``Batch``, plus ``inferq`` progress counters."""
    n = counts(h)
    failed = n[B.INVALID] + n[B.FAILED] + n[B.EXPIRED]
    errors = json.loads(h[B.ERRORS]) if h.get(B.ERRORS) else None
    body: dict[str, Any] = {
        "id": batch_id, "object": "batch", "endpoint": h[B.ENDPOINT], "errors": errors,
        "input_file_id": h[B.INPUT_FILE_ID], "completion_window": h[B.COMPLETION_WINDOW],
        "status": h[B.STATUS], "output_file_id": h.get(B.OUTPUT_FILE_ID) or None,
        "error_file_id": h.get(B.ERROR_FILE_ID) or None,
        "request_counts": {"total": n[B.TOTAL], "completed": n[B.COMPLETED],
                           "failed": failed},
        "metadata": json.loads(h.get(B.METADATA) or "null"), "model": h[B.MODEL],
    }
    for f in _TIMES:
        body[f.value] = int(h[f]) if h.get(f) else None
    body["inferq"] = {"priority": int(h[B.PRIORITY]), "ingested": n[B.CURSOR],
                      "invalid": n[B.INVALID], "expired": n[B.EXPIRED],
                      "withdrawn": n[B.WITHDRAWN]}
    return body


def priority_of(metadata: dict[str, str] | None, default: int,
                caller: Principal = OPERATOR) -> int:
    """A batch's priority: ``metadata.priority`` (403 above the caller's ceiling), else the
    default, lowered to the ceiling."""
    raw = (metadata or {}).get("priority")
    if raw is None:
        ceiling = caller.max_priority
        return default if ceiling is None else min(default, ceiling)
    try:
        value = int(raw)
    except ValueError:
        value = PRIORITY_MAX + 1
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise BatchRefused(400, "invalid_request", f"metadata.priority must be an integer in "
                           f"[{PRIORITY_MIN}, {PRIORITY_MAX}], got {raw!r}", "metadata")
    reason = caller.priority_refusal(value)
    if reason is not None:
        raise BatchRefused(403, "priority_not_allowed", reason, "metadata")
    return value


def not_found(batch_id: str) -> BatchRefused:
    return BatchRefused(404, "not_found", f"no batch {batch_id!r}")


class Batches:
    def __init__(self, redis: Any, files: Files, config: BatchConfig,
                 namespace: str) -> None:
        self.redis = redis
        self.files = files
        self.config = config
        self.namespace = namespace
        self.index = Index(namespace)
        self.scripts = ops.register(redis)

    async def keys_of(self, batch_id: str) -> BatchKeys | None:
        queue = await self.redis.hget(self.index.where, batch_id)
        if queue is None:
            return None
        task, model = _text(queue).split(":", 1)
        return BatchKeys.of(batch_id, task, model, self.namespace)

    async def now_s(self) -> int:
        seconds, _ = await self.redis.time()
        return int(seconds)

    async def create(self, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None,
                     caller: Principal = OPERATOR,
                     trace: tracing.Parent | None = None) -> dict[str, Any]:
        """``trace``: the creating call's trace context, which every line's request carries."""
        if endpoint not in TASKS:
            raise BatchRefused(400, "invalid_request", f"endpoint must be one of "
                               f"{sorted(TASKS)}, got {endpoint!r}", "endpoint")
        if completion_window not in WINDOWS:
            raise BatchRefused(400, "invalid_request", f"completion_window must be one of "
                               f"{sorted(WINDOWS)}, got {completion_window!r}",
                               "completion_window")
        priority = priority_of(metadata, self.config.priority, caller)
        meta = await self.files.get(input_file_id, caller)
        if meta is None:
            raise BatchRefused(404, "not_found", f"no file {input_file_id!r}", "input_file_id")
        if meta["purpose"] != "batch":
            raise BatchRefused(400, "invalid_request", f"file {input_file_id!r} has purpose "
                               f"{meta['purpose']!r}, not 'batch'", "input_file_id")
        if meta["bytes"] > self.config.max_batch_bytes:
            raise BatchRefused(400, "file_too_large", f"a batch's input file has at most "
                               f"{self.config.max_batch_bytes} bytes, {input_file_id!r} has "
                               f"{meta['bytes']}", "input_file_id")
        store = self.files.store
        total, model = await asyncio.to_thread(
            lambda: check_file(store.blocks(content_name(input_file_id)), endpoint,
                               self.config.max_batch_lines, self.config.max_line_bytes))
        task = TASKS[endpoint]
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        keys = BatchKeys.of(batch_id, task, model, self.namespace)
        seconds, micros = await self.redis.time()
        now = int(seconds)
        created_ms = now * 1000 + int(micros) // 1000
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.index.where, batch_id, keys.queue.queue)
            pipe.zadd(self.index.batches, {batch_id: created_ms})
            if caller.tenant is not None:
                pipe.zadd(self.index.batches_of(caller.tenant), {batch_id: created_ms})
            pipe.sadd(self.index.active, batch_id)
            await pipe.execute()
        await self.redis.hset(keys.batch, mapping={
            B.STATUS: "validating", B.ENDPOINT: endpoint, B.MODEL: model, B.TASK: task,
            B.INPUT_FILE_ID: input_file_id, B.COMPLETION_WINDOW: completion_window,
            B.METADATA: json.dumps(metadata), B.PRIORITY: priority, B.CREATED_AT: now,
            B.EXPIRES_AT: now + WINDOWS[completion_window], B.TOTAL: total, B.CURSOR: 0,
            B.OFFSET: 0, B.PARTS: 0, B.OWNER: caller.tenant or "",
            B.MAX_PRIORITY: "" if caller.max_priority is None else caller.max_priority,
            B.LIMITS: limits_field(caller),
            B.TRACEPARENT: trace.traceparent if trace is not None else "",
            B.TRACESTATE: (trace.tracestate or "") if trace is not None else ""})
        await self.redis.lpush(self.index.wake, batch_id)
        created = await self.get(batch_id, caller)
        assert created is not None
        return created

    async def get(self, batch_id: str, caller: Principal = OPERATOR) -> dict[str, Any] | None:
        """The batch, or None when there is none ``caller`` may see."""
        keys = await self.keys_of(batch_id)
        if keys is None:
            return None
        h = decode(await self.redis.hgetall(keys.batch))
        if not h or not caller.owns(h.get(B.OWNER) or None):
            return None
        return batch_object(batch_id, h)

    def _listed(self, caller: Principal) -> str:
        """The index ``caller`` lists: every batch, or its tenant's."""
        if caller.sees_all or caller.tenant is None:
            return self.index.batches
        return self.index.batches_of(caller.tenant)

    async def list(self, after: str | None, limit: int,
                   caller: Principal = OPERATOR) -> tuple[list[dict[str, Any]], bool]:
        """The batches ``caller`` may see, newest first, after the id ``after``."""
        index = self._listed(caller)
        start = 0
        if after is not None:
            rank = await self.redis.zrevrank(index, after)
            if rank is None:
                return [], False
            start = int(rank) + 1
        ids = await self.redis.zrange(index, start, start + limit, desc=True)
        found = []
        for raw in ids[:limit]:
            item = await self.get(_text(raw), caller)
            if item is not None:
                found.append(item)
        return found, len(ids) > limit

    async def cancel(self, batch_id: str, caller: Principal = OPERATOR) -> dict[str, Any]:
        keys = await self.keys_of(batch_id)
        if keys is None or await self.get(batch_id, caller) is None:
            raise not_found(batch_id)
        k, a = ops.status_call(keys, "", ("validating", "in_progress"), "cancelling",
                               B.CANCELLING_AT)
        outcome, status = ops.parse_pair(await self.scripts["status"](keys=k, args=a))
        if outcome == "gone":
            raise not_found(batch_id)
        if outcome == "refused" and status not in ("cancelling", "cancelled"):
            raise BatchRefused(409, "conflict", f"batch {batch_id} is {status}: only a "
                               "validating or in_progress batch can be cancelled")
        await self.redis.lpush(self.index.wake, batch_id)
        found = await self.get(batch_id, caller)
        assert found is not None
        return found

    async def stats(self, caller: Principal = OPERATOR) -> dict[str, Any]:
        """Batches by status, lines by outcome, and the progress of the active ones (those
        ``caller`` may see)."""
        items = []
        for raw in await self.redis.zrange(self._listed(caller), 0, -1):
            item = await self.get(_text(raw), caller)
            if item is not None:
                items.append(item)
        return summarize(items)


def summarize(items: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"batches": {status: n}, "lines": {outcome: n}, "active": [batch, ...]}``."""
    by_status: dict[str, int] = {}
    lines = {"completed": 0, "failed": 0, "invalid": 0, "expired": 0, "withdrawn": 0}
    active = []
    for item in items:
        by_status[item["status"]] = by_status.get(item["status"], 0) + 1
        extra = item["inferq"]
        lines["completed"] += item["request_counts"]["completed"]
        lines["failed"] += item["request_counts"]["failed"] - extra["invalid"] - extra["expired"]
        for name in ("invalid", "expired", "withdrawn"):
            lines[name] += extra[name]
        if item["status"] in ACTIVE:
            active.append(item)
    return {"batches": by_status, "lines": lines, "active": active}


def read_sync(client: Any, namespace: str) -> dict[str, Any]:
    """``summarize`` of every batch, on a sync client (``inferq stats``)."""
    index = Index(namespace)
    items = []
    for raw in client.zrange(index.batches, 0, -1):
        batch_id = _text(raw)
        queue = client.hget(index.where, batch_id)
        if queue is None:
            continue
        task, model = _text(queue).split(":", 1)
        h = decode(client.hgetall(BatchKeys.of(batch_id, task, model, namespace).batch))
        if h:
            items.append(batch_object(batch_id, h))
    return summarize(items)


def format_summary(summary: dict[str, Any]) -> str:
    """The text of ``inferq stats``'s batches section ('' without batches)."""
    if not summary["batches"]:
        return ""
    by_status = ", ".join(f"{k}={v}" for k, v in sorted(summary["batches"].items()))
    by_outcome = ", ".join(f"{k}={v}" for k, v in summary["lines"].items())
    out = [f"batches {by_status}", f"  lines {by_outcome}"]
    for b in summary["active"]:
        counts = b["request_counts"]
        done = counts["completed"] + counts["failed"]
        share = done / counts["total"] if counts["total"] else 0.0
        out.append(f"  batch {b['id']} {b['status']} {b['endpoint']} {b['model']}: "
                   f"{done}/{counts['total']} done ({share:.0%}), "
                   f"{b['inferq']['ingested']} queued so far, priority "
                   f"{b['inferq']['priority']}")
    return "\n".join(out)
