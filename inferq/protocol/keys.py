"""Every Redis key name inferq uses, in one place.

All keys of one queue share the hash tag ``{task:model}``, so each Lua script touches a single
cluster slot and the design runs unchanged on Redis Cluster. Per-request keys are built inside
the scripts from ``prefix`` (same tag, same slot) because their ids are only known there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferq.errors import ValidationError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DEFAULT_NAMESPACE = "inferq"

#: Registry of queue names (a plain set, outside any queue's slot) for ``inferq stats``.
def queues_registry(namespace: str = DEFAULT_NAMESPACE) -> str:
    return f"{namespace}:queues"


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValidationError(
            f"{kind} must match {NAME_RE.pattern} (letters, digits, '.', '_', '-'), got {value!r}"
        )
    return value


def queue_name(task: str, model: str) -> str:
    return f"{check_name('task', task)}:{check_name('model', model)}"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Key names of one queue (one task on one model)."""

    queue: str
    namespace: str = DEFAULT_NAMESPACE

    @classmethod
    def for_model(cls, task: str, model: str, namespace: str = DEFAULT_NAMESPACE) -> QueueKeys:
        return cls(queue_name(task, model), namespace)

    @property
    def prefix(self) -> str:
        """``inferq:{task:model}:`` — scripts append ``req:<id>`` and ``result:<id>``."""
        return f"{self.namespace}:{{{self.queue}}}:"

    @property
    def pending(self) -> str:
        return self.prefix + "pending"

    @property
    def inflight(self) -> str:
        return self.prefix + "inflight"

    @property
    def seq(self) -> str:
        return self.prefix + "seq"

    @property
    def wake(self) -> str:
        """List of wake-up tokens: enqueue pushes, idle workers block on it (BLPOP)."""
        return self.prefix + "wake"

    @property
    def delayed(self) -> str:
        """Sorted set: id -> time (ms) its retry backoff ends; claim promotes due ones."""
        return self.prefix + "delayed"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def workers(self) -> str:
        """Sorted set: worker id -> liveness deadline (ms, Redis clock)."""
        return self.prefix + "workers"

    @property
    def stats(self) -> str:
        """Hash of counters (completed, failed, dead, reclaimed, ...)."""
        return self.prefix + "stats"

    @property
    def throughput(self) -> str:
        """Hash: unix second -> completed count, trimmed to recent seconds."""
        return self.prefix + "tput"

    def tuning(self, model_id: str) -> str:
        """Hash of persisted adaptive-window state for this queue and model weights."""
        return f"{self.prefix}tuning:{model_id}"

    def window(self, worker_id: str) -> str:
        """Hash with one worker's current window, for ``inferq stats``."""
        return f"{self.prefix}window:{worker_id}"

    def cancels(self, worker_id: str) -> str:
        """List of request ids cancelled while ``worker_id`` ran them (``generate`` workers
        block on it with the wake list and drop the generation at its next decode step)."""
        return f"{self.prefix}cancels:{worker_id}"

    def inbox(self, client_id: str) -> str:
        """List of ``<id> <result>`` entries for one async client (its single waiting
        connection), pushed by whoever writes a result of a request that named it."""
        return f"{self.prefix}inbox:{client_id}"

    def request(self, request_id: str) -> str:
        return f"{self.prefix}req:{request_id}"

    def result(self, request_id: str) -> str:
        """A list holding exactly one msgpack result; readers block on it with BLMOVE."""
        return f"{self.prefix}result:{request_id}"

    def stream(self, request_id: str) -> str:
        """A Redis Stream of a generation's text deltas (``generate``), with the result's TTL;
        readers follow it with ``XREAD BLOCK`` from the start."""
        return f"{self.prefix}stream:{request_id}"
