"""The batch scripts (``inferq/protocol/lua/batch/*.lua``): their sources, with the same
prelude as the queue's scripts (request fields, key suffixes) plus the batch hash's fields,
and the one Python description of each script's input (checked against its header by
``tests/unit/test_batch_scripts.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inferq.batch.fields import lua_constants
from inferq.batch.keys import BatchKeys, inbox_name
from inferq.protocol import scripts
from inferq.protocol.ops import Call, as_str

NAMES = ("lease", "commit", "status", "withdraw")


def source(name: str) -> str:
    return scripts.constants() + lua_constants() + scripts._expand(
        scripts._read(f"batch/{name}.lua"), set())


ALL: dict[str, str] = {name: source(name) for name in NAMES}


def register(client: Any) -> dict[str, Any]:
    return {name: client.register_script(text) for name, text in ALL.items()}


def lease_call(keys: BatchKeys, token: str, lease_ms: int) -> Call:
    return [keys.batch], [token, lease_ms]


@dataclass(frozen=True, slots=True)
class Step:
    """What one step of the holder did, committed by ``commit``."""

    parts: int
    wrote_part: bool
    cursor: int
    new_cursor: int
    new_offset: int
    drained: int = 0
    invalid: int = 0
    completed: int = 0
    failed: int = 0
    expired: int = 0


def commit_call(keys: BatchKeys, token: str, step: Step) -> Call:
    return [keys.batch, keys.inbox], [
        token, step.parts, 1 if step.wrote_part else 0, step.cursor, step.new_cursor,
        step.new_offset, step.drained, step.invalid, step.completed, step.failed,
        step.expired]


def status_call(keys: BatchKeys, token: str, allowed: Iterable[str], status: str, stamp: str,
                values: Sequence[tuple[str, str | int]] = ()) -> Call:
    args: list[bytes | str | int] = [token, " ".join(allowed), status, stamp]
    for field, value in values:
        args += [field, value]
    return [keys.batch], args


def parse_pair(reply: Any) -> tuple[str, str]:
    return as_str(reply[0]), as_str(reply[1])


def withdraw_call(keys: BatchKeys, token: str, mode: str, result_ttl_ms: int,
                  ids: Sequence[str]) -> Call:
    queue = keys.queue
    return ([queue.pending, queue.delayed, keys.batch, queue.stats],
            [queue.prefix, token, mode, inbox_name(keys.batch_id), result_ttl_ms, *ids])
