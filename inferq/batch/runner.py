"""The work on batches, done by every gateway process (one ``BatchRunner`` each), each batch
by one process at a time: the holder of its lease.

A step of the holder reads the batch hash, does one bounded piece of work, writes what it
made to the file store (a numbered part, overwritten if the step is redone) and commits
through one script that checks the lease token and the part number and cursor the step
started from. A gateway killed anywhere in a step leaves the batch where the last commit put
it; the next holder redoes the step: the queue's enqueue is idempotent on the line ids, a
part is overwritten, the inbox is trimmed only by the commit. Nothing is lost or duplicated.

The pieces of work, in order: move a new batch to ``in_progress``; withdraw the waiting lines
of a cancelled or expired batch; queue the next lines (as many as ``feed`` allows and the
owner's per-tenant limits admit: ``limits``; lines over a limit wait for its retry-after);
append the finished lines drained from the batch's inbox to a part (settling their
reservations on their actual tokens); once every line is accounted
for, ``finalizing``: stream the parts into the output and error files, then the terminal
status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from inferq.batch import ops
from inferq.batch.batches import Batches, decode
from inferq.batch.envelope import line_request_id, read_lines
from inferq.batch.feed import Feed
from inferq.batch.fields import BatchField as B
from inferq.batch.files import content_name
from inferq.batch.keys import BatchKeys, inbox_name
from inferq.batch.limits import admit_lines, owner_principal
from inferq.batch.lines import LineRefused, error_line, outcome, parse_line, response_line
from inferq.errors import InferqError
from inferq.openai.errors import INVALID, ApiError, from_inferq
from inferq.producer.aio import AsyncClient
from inferq.producer.replies import BACK_PRESSURE
from inferq.protocol import ops as queue_ops
from inferq.protocol.codec import Status, decode_result
from inferq.tenancy.limits import Limiter, actual_tokens
from inferq.tenancy.principal import Principal

log = logging.getLogger("inferq.gateway.batch")

#: Ids per withdraw call.
WITHDRAW_CHUNK = 500
#: The longest a batch whose steps keep failing waits for its next try.
MAX_BACKOFF_S = 30.0
#: What a line's reservation under its owner's limits holds beyond the batch's window.
RESERVATION_MARGIN_S = 60.0


def refused_line(request_id: str, custom_id: str, error: ApiError) -> bytes:
    """The error-file line of a line refused before it was queued (OpenAI's shape)."""
    error.request_id = request_id
    return response_line(request_id, custom_id, error.status, error.body())


class LeaseLost(Exception):
    """Another process holds the batch now: this one stops working on it."""


def part_names(batch_id: str, n: int) -> tuple[str, str]:
    return f"batches/{batch_id}/part-{n}.out", f"batches/{batch_id}/part-{n}.err"


def output_file_ids(batch_id: str) -> tuple[str, str]:
    """Derived from the batch id: a finalization redone rewrites the same files."""
    suffix = batch_id.removeprefix("batch_")
    return f"file-{suffix}-output", f"file-{suffix}-errors"


@dataclass
class Held:
    keys: BatchKeys
    h: dict[str, str]
    feed: Feed = field(default_factory=Feed)
    #: Redis' clock (unix seconds), read once per step.
    now_s: int = 0

    def n(self, f: B) -> int:
        return int(self.h.get(f, 0) or 0)

    @property
    def status(self) -> str:
        return self.h[B.STATUS]

    @property
    def owner(self) -> str | None:
        """The tenant that owns the batch (None: the operator)."""
        return self.h.get(B.OWNER) or None

    @property
    def principal(self) -> Principal:
        """The owner as a principal: the name space of its lines' ids, and the creating key's
        limits its lines are admitted under."""
        return owner_principal(self.h)

    @property
    def priority(self) -> int:
        """The lines' priority: the batch's, never above the creating key's ceiling."""
        ceiling = self.h.get(B.MAX_PRIORITY)
        return self.n(B.PRIORITY) if not ceiling else min(self.n(B.PRIORITY), int(ceiling))

    @property
    def accounted(self) -> int:
        return sum(self.n(f) for f in (B.INVALID, B.COMPLETED, B.FAILED, B.EXPIRED,
                                       B.WITHDRAWN))


class BatchRunner:
    def __init__(self, batches: Batches, client: AsyncClient) -> None:
        self.batches = batches
        self.client = client
        self.redis = batches.redis
        self.config = batches.config
        self.store = batches.files.store
        self.scripts = batches.scripts
        self.token = uuid.uuid4().hex
        self._feeds: dict[str, Feed] = {}
        #: A batch's keys never change: read from the index once.
        self._keys: dict[str, BatchKeys] = {}
        self._stop = asyncio.Event()
        #: Batches whose last step raised: when to try again, and how many failed in a row.
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self.limiter = Limiter(self.redis, batches.namespace)
        #: Batches whose next lines wait for their owner's limits: until when (monotonic).
        self._limited_until: dict[str, float] = {}

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Until ``stop``: work on every active batch whose lease this process gets; when
        none had anything to do, block on Redis (a held batch's inbox, else the wake list)."""
        while not self._stop.is_set():
            try:
                waiting = await self.round()
                if waiting is None:
                    await self.redis.blpop([self.batches.index.wake], self.config.idle_s)
                elif waiting:
                    await self.redis.blmove(waiting, waiting, self.config.idle_s,
                                            "RIGHT", "RIGHT")
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken round is logged and retried, never fatal
                log.exception("batch runner: round failed")
                await asyncio.sleep(self.config.idle_s)

    async def round(self) -> str | None:
        """One step on each active batch. Returns None when nothing was done and nothing is
        awaited, the inbox to block on when nothing was done, '' when work was done.

        Each batch's step is isolated: one that raises is logged and that batch alone is
        retried later (backing off while it keeps failing); the others go on in this round."""
        did = False
        inbox: str | None = None
        now = time.monotonic()
        for raw in await self.redis.smembers(self.batches.index.active):
            batch_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            if self._retry_at.get(batch_id, 0.0) > now:
                continue
            try:
                worked, waits_on = await self.step(batch_id)
            except LeaseLost:
                continue
            except Exception:
                self._failed(batch_id)
                continue
            self._retry_at.pop(batch_id, None)
            self._failures.pop(batch_id, None)
            did = did or worked
            inbox = inbox or waits_on
        return "" if did else inbox

    def _failed(self, batch_id: str) -> None:
        """A step of ``batch_id`` raised: log it, and skip the batch for a while (doubling,
        up to ``MAX_BACKOFF_S``) so a step that keeps failing costs no other batch a thing."""
        failures = self._failures.get(batch_id, 0) + 1
        self._failures[batch_id] = failures
        delay = min(MAX_BACKOFF_S, self.config.idle_s * 2 ** min(failures - 1, 16))
        self._retry_at[batch_id] = time.monotonic() + delay
        log.exception("batch %s: a step failed (%d in a row); retried in %.1f s", batch_id,
                      failures, delay)

    async def lease(self, keys: BatchKeys) -> str | None:
        k, a = ops.lease_call(keys, self.token, int(self.config.lease_s * 1000))
        held, status = ops.parse_pair(await self.scripts["lease"](keys=k, args=a))
        if held == "-1":
            return ""
        return status if held == "1" else None

    async def step(self, batch_id: str) -> tuple[bool, str | None]:
        """One bounded piece of work on a batch: (whether work was done, an inbox to wait
        on)."""
        keys = self._keys.get(batch_id) or await self.batches.keys_of(batch_id)
        if keys is None:
            await self.redis.srem(self.batches.index.active, batch_id)
            return True, None
        self._keys[batch_id] = keys
        status = await self.lease(keys)
        if status == "":  # the batch is gone
            await self.redis.srem(self.batches.index.active, batch_id)
            return True, None
        if status is None:
            return False, None
        held = Held(keys, decode(await self.redis.hgetall(keys.batch)),
                    self._feeds.setdefault(batch_id, Feed(
                        floor=self.config.min_outstanding,
                        ceiling=self.config.max_outstanding)))
        try:
            return await self._step(held)
        except FileNotFoundError as exc:
            await self.fail(held, "input_file_missing", f"the input file is gone: {exc}")
            return True, None

    async def _step(self, held: Held) -> tuple[bool, str | None]:
        status = held.status
        if status in ("completed", "failed", "expired", "cancelled"):
            await self.clean_up(held.keys)  # a holder died between the status and this
            return True, None
        if status == "validating":
            await self.move(held, ("validating",), "in_progress", B.IN_PROGRESS_AT)
            return True, None
        if status == "finalizing":
            await self.finalize(held)
            return True, None
        held.now_s = await self.batches.now_s()
        expiring = status == "in_progress" and held.now_s >= held.n(B.EXPIRES_AT)
        if status == "cancelling" and not held.n(B.SWEPT):
            await self.withdraw(held, "cancel")
            return True, None
        if expiring and not held.n(B.SWEPT):
            await self.withdraw(held, "expire")
            return True, None
        worked = False
        if status == "in_progress" and held.n(B.CURSOR) < held.n(B.TOTAL):
            worked = await self.ingest(held, expire=expiring)
            if worked:
                return True, None
        if await self.drain(held):
            return True, None
        total = held.n(B.TOTAL) if status == "in_progress" else held.n(B.CURSOR)
        if (status == "cancelling" or held.n(B.CURSOR) == held.n(B.TOTAL)) and \
                held.accounted >= total:
            final = "cancelled" if status == "cancelling" else (
                "expired" if expiring else "completed")
            await self.move(held, (status,), "finalizing", B.FINALIZING_AT,
                            [(B.FINAL_STATUS, final)])
            return True, None
        return worked, held.keys.inbox

    async def move(self, held: Held, allowed: tuple[str, ...], status: str, stamp: str,
                   values: list[tuple[str, str | int]] | None = None) -> None:
        k, a = ops.status_call(held.keys, self.token, allowed, status, stamp, values or [])
        outcome_, _ = ops.parse_pair(await self.scripts["status"](keys=k, args=a))
        if outcome_ == "lost":
            raise LeaseLost(held.keys.batch_id)
        if outcome_ == "ok":
            log.info("batch %s: %s", held.keys.batch_id, status)

    async def fail(self, held: Held, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message,
                                              "param": None, "line": None}]}
        await self.move(held, ("validating", "in_progress", "cancelling", "finalizing"),
                        "failed", B.FAILED_AT, [(B.ERRORS, json.dumps(errors))])

    async def commit(self, held: Held, step: ops.Step) -> None:
        k, a = ops.commit_call(held.keys, self.token, step)
        reply = queue_ops.as_str(await self.scripts["commit"](keys=k, args=a))
        if reply == "lost":
            raise LeaseLost(held.keys.batch_id)
        if reply != "ok":
            log.warning("batch %s: a step was refused (%s); it is redone from the batch's "
                        "state", held.keys.batch_id, reply)

    def _lines(self, held: Held, count: int) -> list[tuple[int, bytes]]:
        name = content_name(held.h[B.INPUT_FILE_ID])
        offset = held.n(B.OFFSET)
        return list(islice(read_lines(self.store.blocks(name, offset), offset), count))

    async def ingest(self, held: Held, *, expire: bool) -> bool:
        """Queue the next lines (or, once the window is over, write them expired)."""
        outstanding = held.n(B.CURSOR) - held.accounted
        batch_id = held.keys.batch_id
        if not expire and self._limited_until.get(batch_id, 0.0) > time.monotonic():
            return False
        if not expire:
            held.feed.observe(time.monotonic(), await self.queue_done(held.keys),
                              held.accounted)
        room = self.config.chunk if expire else min(
            self.config.chunk, held.feed.room(outstanding, time.monotonic()))
        if room <= 0:
            return False
        lines = await asyncio.to_thread(self._lines, held, room)
        if not lines:
            return False
        deadline_s = max(1.0, float(held.n(B.EXPIRES_AT) - held.now_s))
        #: Per line: its error line, or the index of its queue item.
        made: list[bytes | int] = []
        mapping: dict[str, str] = {}
        items: list[queue_ops.EnqueueItem] = []
        for _, raw in lines:
            line = self._ingest_line(held, raw, expire=expire, deadline_s=deadline_s)
            if isinstance(line, bytes):
                made.append(line)
                continue
            stored_id, meta, item = line
            mapping[stored_id] = meta
            made.append(len(items))
            items.append(item)
        count = len(lines)
        if items:
            admitted = await admit_lines(self.limiter, held.principal, items,
                                         deadline_s + RESERVATION_MARGIN_S)
            if admitted.count < len(items):
                # Over a limit: commit only the lines before the first one not admitted; it
                # waits (or, if it can never fit, fails alone and is committed too).
                count = made.index(admitted.count)
                if admitted.too_large is not None:
                    refused = items[admitted.count]
                    made[count] = refused_line(
                        held.principal.public_id(refused.id),
                        str(json.loads(mapping[refused.id])[0]), admitted.too_large)
                    count += 1
                else:
                    self._limited_until[batch_id] = time.monotonic() + admitted.wait_ms / 1000
                items = items[:admitted.count]
                if count == 0:
                    return False
        if items:
            await self.redis.hset(held.keys.lines, mapping=mapping)
            outcomes = (await self.client.enqueue_items(held.keys.queue, items)).outcomes
            pressed = [i for i, o in enumerate(outcomes) if o in BACK_PRESSURE]
            if pressed:
                # Back-pressure: commit only the lines before the first one refused (those
                # after it that got in are queued again, idempotently, by the next step).
                count = min(count, made.index(pressed[0]))
                if count == 0:
                    return False
        errors = [m for m in made[:count] if isinstance(m, bytes)]
        expired = len(errors) if expire else 0
        invalid = 0 if expire else len(errors)
        end_offset = lines[count - 1][0]
        wrote = bool(errors)
        if wrote:
            out_name, err_name = part_names(batch_id, held.n(B.PARTS))
            await asyncio.to_thread(self.store.write_lines, out_name, [])
            await asyncio.to_thread(self.store.write_lines, err_name, errors)
        cursor = held.n(B.CURSOR)
        await self.commit(held, ops.Step(parts=held.n(B.PARTS), wrote_part=wrote,
                                         cursor=cursor, new_cursor=cursor + count,
                                         new_offset=end_offset, invalid=invalid,
                                         expired=expired))
        return True

    def _ingest_line(self, held: Held, raw: bytes, *, expire: bool,
                     deadline_s: float) -> bytes | tuple[str, str, queue_ops.EnqueueItem]:
        """One input line: its error-file line, or its stored id, its meta and its queue
        item. It runs as the owner's request: the owner's tenant (fair share), an id in the
        owner's name space, the batch's priority within the creating key's ceiling."""
        parsed = parse_line(raw, held.h[B.ENDPOINT])
        public_id = line_request_id(held.keys.batch_id, parsed.custom_id)
        if expire:
            return error_line(public_id, parsed.custom_id, "expired",
                              "the batch expired before this line was queued")
        if isinstance(parsed, LineRefused):
            return refused_line(public_id, parsed.custom_id, parsed.error)
        stored_id = held.principal.stored_id(public_id)
        request = {**parsed.enqueue, "priority": held.priority, "deadline_s": deadline_s,
                   "id": stored_id}
        if held.owner is not None:
            request["tenant"] = held.owner
        if traceparent := held.h.get(B.TRACEPARENT):
            request["traceparent"] = traceparent
            if tracestate := held.h.get(B.TRACESTATE):
                request["tracestate"] = tracestate
        prepared = self._prepare(parsed.prompt, request, held.keys.batch_id)
        if isinstance(prepared, ApiError):  # what the queue refuses: this line only
            return refused_line(public_id, parsed.custom_id, prepared)
        return stored_id, json.dumps(parsed.meta), prepared

    def _prepare(self, prompt: str, request: dict[str, Any],
                 batch_id: str) -> queue_ops.EnqueueItem | ApiError:
        """A line's queue item, or the error the online endpoint would answer for what the
        SDK refuses at enqueue (an empty or blank input, one over the prompt limit, a
        parameter or priority out of bounds): that line goes to the error file, the batch
        goes on."""
        try:
            return self.client.prepare(prompt, request, reply_to=inbox_name(batch_id)).item
        except InferqError as exc:
            return from_inferq(exc)
        except (TypeError, ValueError) as exc:  # not the SDK's own: still this line's fault
            return ApiError(400, INVALID, "invalid_request", str(exc))

    async def drain(self, held: Held) -> bool:
        """Append finished lines from the inbox to a part."""
        entries = await self.redis.lrange(held.keys.inbox, 0, self.config.chunk - 1)
        if not entries:
            return False
        parsed = []
        for entry in entries:
            data = entry if isinstance(entry, bytes) else str(entry).encode()
            head, _, body = data.partition(b" ")
            parsed.append((head.decode(), body))
        metas = await self.redis.hmget(held.keys.lines, [i for i, _ in parsed])
        created = held.now_s
        settled: list[tuple[str, int | None]] = []
        out: list[bytes] = []
        err: list[bytes] = []
        tally = {"completed": 0, "failed": 0, "expired": 0}
        endpoint, model = held.h[B.ENDPOINT], held.h[B.MODEL]
        for (line_id, body), meta in zip(parsed, metas, strict=True):
            result = decode_result(body, self.client.options.limits)
            settled.append((result.id, actual_tokens(result)))
            # the files name a line by the id its owner knows it by
            result = result.model_copy(update={"id": held.principal.public_id(result.id)})
            line_meta = json.loads(meta) if meta is not None else [line_id, False, 0]
            done = outcome(endpoint, model, result, line_meta, created)
            tally[done.kind] += 1
            (out if done.kind == "completed" else err).append(done.line)
        if held.principal.limited:  # once per id: a drain redone settles nothing twice
            await self.limiter.settle(held.principal, settled)
        out_name, err_name = part_names(held.keys.batch_id, held.n(B.PARTS))
        await asyncio.to_thread(self.store.write_lines, out_name, out)
        await asyncio.to_thread(self.store.write_lines, err_name, err)
        cursor = held.n(B.CURSOR)
        await self.commit(held, ops.Step(parts=held.n(B.PARTS), wrote_part=True, cursor=cursor,
                                         new_cursor=cursor, new_offset=held.n(B.OFFSET),
                                         drained=len(entries), **tally))
        return True

    async def queue_done(self, keys: BatchKeys) -> int:
        """Requests the batch's queue (shard 0) has finished, from its stats counters: with
        the batch's own, the feed tells online traffic."""
        values = await self.redis.hmget(keys.queue.stats, [s.value for s in Status])
        return sum(int(v) for v in values if v is not None)

    def _ids(self, held: Held) -> Iterator[str]:
        """The ids of the lines ingested so far, and of one chunk more (a step that queued
        them may have died before its commit)."""
        name = content_name(held.h[B.INPUT_FILE_ID])
        count = held.n(B.CURSOR) + self.config.chunk
        for _, raw in islice(read_lines(self.store.blocks(name)), count):
            yield held.principal.stored_id(
                line_request_id(held.keys.batch_id, json.loads(raw)["custom_id"]))

    async def withdraw(self, held: Held, mode: str) -> None:
        """Take the batch's waiting lines out of the queue, chunk by chunk (a pass redone
        after a crash finds the withdrawn ones gone and leaves them)."""
        ids = await asyncio.to_thread(lambda: list(self._ids(held)))
        ttl_ms = int(self.client.options.result_ttl_s * 1000)
        withdrawn = 0
        for i in range(0, len(ids), WITHDRAW_CHUNK):
            k, a = ops.withdraw_call(held.keys, self.token, mode, ttl_ms,
                                     ids[i:i + WITHDRAW_CHUNK])
            n = int(await self.scripts["withdraw"](keys=k, args=a))
            if n < 0:
                raise LeaseLost(held.keys.batch_id)
            withdrawn += n
            if mode == "cancel" and held.principal.limited:
                # Withdrawn lines never run: their reservations go back whole (and those of
                # lines still running with them; an expiry's lines are settled when drained).
                await self.limiter.settle(held.principal,
                                          [(line, 0) for line in ids[i:i + WITHDRAW_CHUNK]])
        log.info("batch %s: %d waiting line(s) withdrawn (%s)", held.keys.batch_id, withdrawn,
                 mode)
        await self.move(held, (held.status,), held.status, "", [(B.SWEPT, 1)])

    async def finalize(self, held: Held) -> None:
        """Stream the parts into the output and error files, then the terminal status."""
        batch_id = held.keys.batch_id
        parts = [part_names(batch_id, n) for n in range(held.n(B.PARTS))]
        out_id, err_id = output_file_ids(batch_id)
        values: list[tuple[str, str | int]] = []
        files = self.batches.files
        if held.n(B.COMPLETED):
            size = await asyncio.to_thread(self.store.concat, content_name(out_id),
                                           [o for o, _ in parts])
            await files.record(out_id, f"{batch_id}_output.jsonl", "batch_output", size,
                               held.owner)
            values.append((B.OUTPUT_FILE_ID, out_id))
        if held.n(B.FAILED) + held.n(B.INVALID) + held.n(B.EXPIRED):
            size = await asyncio.to_thread(self.store.concat, content_name(err_id),
                                           [e for _, e in parts])
            await files.record(err_id, f"{batch_id}_error.jsonl", "batch_output", size,
                               held.owner)
            values.append((B.ERROR_FILE_ID, err_id))
        final = held.h.get(B.FINAL_STATUS) or "completed"
        await self.move(held, ("finalizing",), final, f"{final}_at", values)
        await self.clean_up(held.keys)

    async def clean_up(self, keys: BatchKeys) -> None:
        """After the terminal status (a finalization redone needs the parts): the parts, the
        lines hash, the active entry."""
        await asyncio.to_thread(self.store.delete, f"batches/{keys.batch_id}")
        await self.redis.delete(keys.lines)
        await self.redis.srem(self.batches.index.active, keys.batch_id)
        for known in (self._feeds, self._keys, self._retry_at, self._failures,
                      self._limited_until):
            known.pop(keys.batch_id, None)
