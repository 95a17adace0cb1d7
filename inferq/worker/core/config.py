"""Typed worker configuration; every check names the bad value."""

from __future__ import annotations

import os
import random
import socket
import uuid
from dataclasses import dataclass, field
from typing import Literal

from inferq.connection import ConnectionSettings
from inferq.errors import ConfigError
from inferq.protocol.codec import DEFAULT_LIMITS, Limits
from inferq.protocol.keys import DEFAULT_NAMESPACE, NAME_RE
from inferq.protocol.ops import DEFAULT_MAX_CRASHES
from inferq.worker.core.liveness import WORKER_ID_RE

#: The default lease (``--lease-ms``) and drain timeout (``--drain-timeout-s``).
DEFAULT_LEASE_MS = 2_000
DEFAULT_DRAIN_TIMEOUT_S = 30.0

Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "float16", "bfloat16"]


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    #: Where and how to connect: the SDK's settings (URL, TLS files, credentials, cluster
    #: mode, failover timeout; ``inferq worker`` builds them from its flags and the
    #: environment). Their repr hides the password.
    connection: ConnectionSettings
    model_name: str
    model_spec: str
    task: str = "embed"
    max_batch_size: int = 32
    max_batch_tokens: int | None = 8192
    max_wait_ms: float = 20.0
    device: Device = "auto"
    dtype: DType = "auto"
    #: A request's lease: a worker that stops renewing it (killed, frozen, cut off) loses the
    #: request this long after its last renewal, and another worker runs it. The heartbeat
    #: thread renews every lease the worker holds each ``heartbeat_s`` (lease / 4), whatever
    #: the model and the event loop are doing, so a long batch does not need a long lease.
    lease_ms: int = DEFAULT_LEASE_MS
    heartbeat_ms: int | None = None
    #: After SIGTERM: how long the worker may take to finish the work in hand before it gives
    #: the rest back and stops; a watchdog force-exits it ``STOP_GRACE_S`` after that.
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    result_ttl_s: float = 3600.0
    dead_letter_cap: int = 10_000
    #: A request whose run is lost with its worker this many times while it ran alone (the
    #: last step of the bisection of a crashed batch) is dead-lettered ``crashed_worker``.
    max_crashes: int = DEFAULT_MAX_CRASHES
    #: A request whose run is lost with its worker a second time or more (a crashed batch's
    #: half that crashed again: a crash poison's trail) reruns no sooner than this after the
    #: loss, and such reruns are spaced this far apart for the whole queue, so a poison kills
    #: at most about one worker per delay while it is isolated. None: the lease; 0: at once.
    suspect_delay_ms: int | None = None
    retry_base_ms: float = 250.0
    #: Port for /metrics and /healthz (None: not served; 0: any free port).
    metrics_port: int | None = None
    retry_max_ms: float = 30_000.0
    namespace: str = DEFAULT_NAMESPACE
    worker_id: str = field(default_factory=default_worker_id)
    limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"{name} {rule}, got {getattr(self, name)!r}")

        for name in ("model_name", "task", "namespace"):
            if not NAME_RE.match(getattr(self, name)):
                raise bad(name, f"must match {NAME_RE.pattern}")
        if self.max_batch_size < 1:
            raise bad("max_batch_size", "must be >= 1")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise bad("max_batch_tokens", "must be >= 1 or None")
        if not 0 <= self.max_wait_ms <= 60_000:
            raise bad("max_wait_ms", "must be in [0, 60000]")
        if self.device not in ("auto", "cpu", "cuda"):
            raise bad("device", "must be auto, cpu or cuda")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise bad("dtype", "must be auto, float32, float16 or bfloat16")
        if self.lease_ms < 200:
            raise bad("lease_ms", "must be >= 200")
        if self.heartbeat_ms is not None and not 0 < self.heartbeat_ms < self.lease_ms:
            raise bad("heartbeat_ms", "must be > 0 and < lease_ms")
        if not 0 < self.drain_timeout_s <= 3600:
            raise bad("drain_timeout_s", "must be in (0, 3600]")
        if not self.result_ttl_s > 0:
            raise bad("result_ttl_s", "must be > 0")
        if self.dead_letter_cap < 1:
            raise bad("dead_letter_cap", "must be >= 1")
        if not 1 <= self.max_crashes <= 1000:
            raise bad("max_crashes", "must be in [1, 1000]")
        if self.suspect_delay_ms is not None and not 0 <= self.suspect_delay_ms <= 3_600_000:
            raise bad("suspect_delay_ms", "must be in [0, 3600000] or None")
        if not WORKER_ID_RE.fullmatch(self.worker_id):
            raise bad("worker_id", "must be 1 to 200 printable ASCII characters, no spaces "
                      "(it names the worker's Redis connections)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise bad("metrics_port", "must be in [0, 65535] or None")
        if not 0 < self.retry_base_ms <= self.retry_max_ms:
            raise bad("retry_base_ms", "must be > 0 and <= retry_max_ms")
        if not isinstance(self.connection, ConnectionSettings):
            raise bad("connection", "must be a ConnectionSettings")

    @property
    def heartbeat_s(self) -> float:
        """Leases are extended four times per lease period unless set explicitly."""
        return (self.heartbeat_ms if self.heartbeat_ms is not None else self.lease_ms / 4) / 1e3

    @property
    def reclaim_s(self) -> float:
        """How often a live worker sweeps expired leases (of any worker) back to the queue:
        lease / 8, so a dead worker's requests are free at most lease * 1.125 after its last
        heartbeat."""
        return self.lease_ms / 8e3

    @property
    def liveness_grace_ms(self) -> int:
        """How long a registered worker may be seen without any Redis connection before the
        reclaim sweep takes its leases back: one sweep interval (lease / 8)."""
        return int(self.reclaim_s * 1e3)

    @property
    def liveness_probe_ms(self) -> int:
        """How often the fleet lists the connected workers (one listing, by whichever worker
        sweeps first): twice per grace, so a death is judged within about a sweep of it."""
        return max(1, self.liveness_grace_ms // 2)

    @property
    def suspect_pace_ms(self) -> int:
        """``suspect_delay_ms``, the lease when unset."""
        return self.lease_ms if self.suspect_delay_ms is None else self.suspect_delay_ms

    @property
    def result_ttl_ms(self) -> int:
        return int(self.result_ttl_s * 1000)

    def retry_delay_ms(self, attempt: int) -> int:
        """Before a failed attempt runs again: exponential backoff with jitter,
        base * 2^(attempt-1), capped, times U(0.5, 1)."""
        ceiling = min(self.retry_max_ms, self.retry_base_ms * 2 ** (attempt - 1))
        return max(1, int(ceiling * random.uniform(0.5, 1.0)))
