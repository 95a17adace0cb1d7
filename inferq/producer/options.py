"""A producer's settings: ``ClientOptions`` (with ``Shedding``, priority-aware back-pressure)
and ``EnqueueOptions``, the keyword arguments of every ``enqueue``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict

from inferq import cluster
from inferq.errors import ValidationError
from inferq.protocol import scores
from inferq.protocol.codec import DEFAULT_LIMITS, Limits
from inferq.protocol.keys import DEFAULT_NAMESPACE

#: Blocking reads are sliced (``inferq.producer.waits``) to stay under the read timeout
#: (``ConnectionSettings.socket_timeout``); keepalive also detects a dead peer.
BLOCKING_DEFAULTS: dict[str, Any] = {"socket_keepalive": True}


class EnqueueOptions(TypedDict, total=False):
    """The keyword arguments of every ``enqueue`` (``Client``, ``AsyncClient``,
    ``inferq.enqueue``), written once; see ``Client.enqueue``. ``prepare`` applies defaults."""

    model: Required[str]
    task: str
    priority: int
    deadline_s: float | None
    id: str | None
    params: Mapping[str, Any] | None
    max_attempts: int
    messages: Sequence[Mapping[str, Any]] | None
    tenant: str | None
    cost: int | None
    traceparent: str | None
    tracestate: str | None
    ttft_slo_ms: int | None
    session: str | None


ENQUEUE_KEYS = frozenset(EnqueueOptions.__annotations__)


@dataclass(frozen=True, slots=True)
class Shedding:
    """Priority-aware back-pressure: the share of ``max_queue_depth`` each priority may fill.

    ``levels`` are ``(min_priority, fraction)`` pairs; a request uses the first level whose
    ``min_priority`` it reaches. By default low priority (< 0) is refused once the queue is half
    full, normal priority at 80 %, and high priority (>= 50) only at the full depth, so a flood
    of background work cannot lock out urgent requests.
    """

    levels: tuple[tuple[int, float], ...] = ((50, 1.0), (0, 0.8), (scores.PRIORITY_MIN, 0.5))

    def __post_init__(self) -> None:
        if not self.levels or self.levels[-1][0] > scores.PRIORITY_MIN:
            raise ValidationError(
                f"Shedding.levels must end with a level for priority {scores.PRIORITY_MIN}, "
                f"got {self.levels}")
        previous = None
        for min_priority, fraction in self.levels:
            if not 0 < fraction <= 1:
                raise ValidationError(f"Shedding fraction must be in (0, 1], got {fraction}")
            if previous is not None and (min_priority >= previous[0] or fraction > previous[1]):
                raise ValidationError(
                    "Shedding.levels must go from high to low priority with fractions that do "
                    f"not grow, got {self.levels}")
            previous = (min_priority, fraction)

    def limit(self, priority: int, max_depth: int) -> int:
        if max_depth <= 0:
            return 0
        for min_priority, fraction in self.levels:
            if priority >= min_priority:
                return max(1, int(max_depth * fraction))
        raise AssertionError("unreachable: the last level covers every priority")


@dataclass(frozen=True, slots=True)
class ClientOptions:
    namespace: str = DEFAULT_NAMESPACE
    #: Pending depth at which even the highest priority is refused (0 = unbounded).
    max_queue_depth: int = 1_000_000
    shedding: Shedding = Shedding()
    result_ttl_s: float = 3600.0
    limits: Limits = DEFAULT_LIMITS
    #: Connections of an ``AsyncClient``'s pool; more concurrent calls wait for a free one.
    max_connections: int = 32
    #: When ``enqueue``/``enqueue_many`` return: None (default) once Redis has the request in
    #: memory; ``"fsync"`` once WAITAOF confirms it reached the server's AOF on disk (Redis or
    #: Valkey >= 7.2 with ``appendonly yes``); ``"replica"`` once WAIT confirms at least one
    #: replica has it. Unconfirmed: ``DurabilityError`` (the request may still be queued).
    durability: str | None = None
    durability_timeout_s: float = 5.0
    #: How long a queue's settings (``inferq queue set``: shards, depth limit) read from Redis
    #: are reused before being read again.
    settings_ttl_s: float = 1.0
    #: Warn (``NoWorkerWarning``) after an enqueue to a queue no live worker serves; off, the
    #: check still registers the queue for ``inferq stats`` (the gateway answers 404 instead).
    warn_no_worker: bool = True

    def __post_init__(self) -> None:
        cluster.check_durability(self.durability, self.durability_timeout_s)
        if self.settings_ttl_s < 0:
            raise ValidationError(f"settings_ttl_s must be >= 0, got {self.settings_ttl_s}")
        if self.max_queue_depth < 0:
            raise ValidationError(f"max_queue_depth must be >= 0, got {self.max_queue_depth}")
        if self.max_connections < 2:
            raise ValidationError(f"max_connections must be >= 2, got {self.max_connections}")
        if not self.result_ttl_s > 0:
            raise ValidationError(f"result_ttl_s must be > 0, got {self.result_ttl_s}")
