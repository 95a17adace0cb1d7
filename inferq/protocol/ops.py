"""Arguments for, and replies of, the Lua scripts: shared by the sync SDK, the async SDK and the
worker so that each script has exactly one Python description."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferq.protocol import scripts
from inferq.protocol.keys import QueueKeys

Call = tuple[list[str], list[bytes | str | int]]


def register(client: Any) -> dict[str, Any]:
    """Register every script once on a (sync or asyncio) redis client; EVALSHA from then on."""
    return {name: client.register_script(source) for name, source in scripts.ALL.items()}


def as_str(value: Any) -> str:
    """A Redis reply as text, from a client with or without ``decode_responses``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class EnqueueItem:
    id: str
    band: int
    payload: bytes
    deadline_ms: int | None
    max_attempts: int
    reply_to: str | None = None
    #: Refuse (shed) when the pending depth is already at this limit; 0 = unbounded.
    depth_limit: int = 0


def enqueue_call(keys: QueueKeys, items: Sequence[EnqueueItem]) -> Call:
    args: list[bytes | str | int] = [keys.prefix]
    for item in items:
        args += [item.id, item.band, item.payload,
                 "" if item.deadline_ms is None else item.deadline_ms, item.max_attempts,
                 item.reply_to or "", item.depth_limit]
    return [keys.pending, keys.seq, keys.wake, keys.stats], args


@dataclass(frozen=True, slots=True)
class EnqueueReply:
    depth: int
    #: Per item: queued, or pending/inflight/delayed/done for a repeated id, or full (shed).
    outcomes: list[str]
    retry_after_ms: int


def parse_enqueue(reply: Any) -> EnqueueReply:
    return EnqueueReply(int(reply[0]), [as_str(x) for x in reply[1]], int(reply[2]))


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    payload: bytes
    token: str
    attempt: int
    enqueued_ms: int
    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class ClaimReply:
    now_ms: int
    claimed: list[Claimed]
    expired: int
    #: Milliseconds until the next delayed retry is due, or None when none waits.
    next_retry_ms: int | None


def claim_call(keys: QueueKeys, owner: str, lease_ms: int, max_count: int,
               result_ttl_ms: int) -> Call:
    return ([keys.pending, keys.inflight, keys.stats, keys.delayed, keys.wake],
            [keys.prefix, owner, lease_ms, max_count, result_ttl_ms])


def parse_claim(reply: Any) -> ClaimReply:
    claimed = [
        Claimed(
            id=as_str(row[0]),
            payload=bytes(row[1]),
            token=as_str(row[2]),
            attempt=int(row[3]),
            enqueued_ms=int(row[4]),
            deadline_ms=int(row[5]) if row[5] not in (b"", "", None) else None,
        )
        for row in reply[1]
    ]
    next_due = int(reply[3])
    return ClaimReply(now_ms=int(reply[0]), claimed=claimed, expired=int(reply[2]),
                      next_retry_ms=None if next_due < 0 else next_due)


def heartbeat_call(keys: QueueKeys, worker_id: str, lease_ms: int, liveness_ms: int,
                   leases: Iterable[tuple[str, str]]) -> Call:
    args: list[bytes | str | int] = [keys.prefix, worker_id, lease_ms, liveness_ms]
    for request_id, token in leases:
        args += [request_id, token]
    return [keys.inflight, keys.workers], args


def parse_ids(reply: Any) -> list[str]:
    return [as_str(x) for x in reply]


@dataclass(frozen=True, slots=True)
class Completion:
    id: str
    token: str
    #: A final result status (ok, failed, expired, dead, ...) or ``retry``.
    status: str
    body: bytes
    retry_delay_ms: int = 0


def complete_call(keys: QueueKeys, result_ttl_ms: int, dead_cap: int,
                  items: Sequence[Completion]) -> Call:
    args: list[bytes | str | int] = [keys.prefix, result_ttl_ms, dead_cap]
    for item in items:
        args += [item.id, item.token, item.status, item.body, item.retry_delay_ms]
    return [keys.inflight, keys.stats, keys.delayed, keys.dead, keys.wake], args


def parse_complete(reply: Any) -> list[bool]:
    return [int(x) == 1 for x in reply]


def reclaim_call(keys: QueueKeys, max_count: int, result_ttl_ms: int, dead_cap: int) -> Call:
    return ([keys.inflight, keys.pending, keys.dead, keys.wake, keys.stats],
            [keys.prefix, max_count, result_ttl_ms, dead_cap])


def parse_reclaim(reply: Any) -> tuple[int, int]:
    """(requeued, dead-lettered)."""
    return int(reply[0]), int(reply[1])


def release_call(keys: QueueKeys, leases: Iterable[tuple[str, str]]) -> Call:
    args: list[bytes | str | int] = [keys.prefix]
    for request_id, token in leases:
        args += [request_id, token]
    return [keys.inflight, keys.pending, keys.wake], args


def cancel_call(keys: QueueKeys, request_id: str, result_ttl_ms: int) -> Call:
    return ([keys.pending, keys.inflight, keys.stats, keys.delayed],
            [keys.prefix, request_id, result_ttl_ms])


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One running generation's text and token ids since the last write (neither: the call
    checks the lease only)."""

    id: str
    token: str
    attempt: int
    text: str
    token_ids: Sequence[int] = ()


def stream_call(keys: QueueKeys, result_ttl_ms: int, items: Iterable[StreamDelta]) -> Call:
    args: list[bytes | str | int] = [keys.prefix, result_ttl_ms]
    for item in items:
        args += [item.id, item.token, item.attempt, item.text,
                 " ".join(map(str, item.token_ids))]
    return [keys.inflight], args


def stream_end_call(keys: QueueKeys, result_ttl_ms: int, request_ids: Iterable[str]) -> Call:
    return [keys.inflight], [keys.prefix, result_ttl_ms, *request_ids]
