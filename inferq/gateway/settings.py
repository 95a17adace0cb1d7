"""Gateway configuration: a typed settings object read from the environment.

| variable | default | meaning |
|---|---|---|
| ``INFERQ_REDIS_URL`` | ``redis://localhost:6379/0`` | the queue's Redis (as the SDK) |
| ``INFERQ_GATEWAY_TOKEN`` | unset | operator's token: all scopes, no tenant |
| ``INFERQ_GATEWAY_TIMEOUT_S`` | 60 | how long a call waits for results by default |
| ``INFERQ_GATEWAY_MAX_TIMEOUT_S`` | 600 | the largest wait a caller may ask for |
| ``INFERQ_GATEWAY_MAX_QUEUE_DEPTH`` | 1000000 | back-pressure: 429 beyond this many pending |
| ``INFERQ_GATEWAY_RETRY_AFTER_S`` | 1 | least ``Retry-After`` of a 429 |
| ``INFERQ_GATEWAY_REQUIRE_SERVED_MODEL`` | true | 404 for a model no worker served |
| ``INFERQ_GATEWAY_MAX_EMBEDDING_INPUTS`` | 2048 | inputs per ``/v1/embeddings`` call (OpenAI's) |
| ``INFERQ_GATEWAY_COALESCE`` | true | one ``enqueue_many`` per loop turn for concurrent calls |
| ``INFERQ_GATEWAY_FAST_PATH`` | true | serve plain ``/v1/embeddings`` calls outside FastAPI |
| ``INFERQ_GATEWAY_READY_MODEL`` / ``_READY_TASK`` | ``minilm`` / ``embed`` | ``/readyz`` default |
| ``INFERQ_GATEWAY_FILE_STORE`` | ``~/.inferq/files`` | file contents: a directory or ``s3://b/p`` |
| ``INFERQ_GATEWAY_FILE_STORE_OPTIONS`` | ``{}`` | fsspec options as JSON (``endpoint_url``) |
| ``INFERQ_GATEWAY_BATCH_PRIORITY`` | -50 | batch lines' priority (``metadata.priority`` wins) |
| ``INFERQ_GATEWAY_BATCH_RUNNER`` | true | this process works on batches |
| ``INFERQ_GATEWAY_BATCH_LEASE_S`` | 15 | another gateway takes a batch over after this long |
| ``INFERQ_GATEWAY_BATCH_MAX_OUTSTANDING`` | 4096 | most lines of one batch in the queue |
| ``INFERQ_GATEWAY_BATCH_CHUNK`` | 256 | lines a batch runner queues or drains per step |
| ``INFERQ_GATEWAY_BATCH_IDLE_S`` | 1 | a batch runner with nothing to do blocks this long |
| ``INFERQ_GATEWAY_MAX_BATCH_BYTES`` | 209715200 | largest batch input (200 MB) |
| ``INFERQ_GATEWAY_MAX_BATCH_LINES`` | 50000 | most lines per batch |
| ``INFERQ_GATEWAY_MAX_BATCH_LINE_BYTES`` | 3215360 | longest batch input line (3 MiB + 68 KiB) |
| ``INFERQ_GATEWAY_TENANT_FROM`` | ``none`` | operator's tenant: ``user``, ``header``, ``none`` |
| ``INFERQ_GATEWAY_SESSION_FROM_USER`` | false | ``user`` is the session (no ``X-Session-Id``) |
| ``INFERQ_GATEWAY_MAX_BODY_MB`` | 16 | largest body (413 beyond, as it streams in) |
| ``INFERQ_GATEWAY_MAX_FILE_MB`` | 200 | largest ``/v1/files`` upload (OpenAI's) |
| ``INFERQ_GATEWAY_ALLOWED_HOSTS`` | ``localhost,127.0.0.1,::1`` | Hosts served while open |
| ``INFERQ_GATEWAY_MAX_STREAMS`` | 2048 | open event streams per gateway (429 beyond) |
| ``INFERQ_GATEWAY_MAX_STREAMS_PER_TENANT`` | 512 | open event streams per tenant (429 beyond) |

The Redis URL and the token are ``SecretStr``: neither appears in a repr or a log line; log
``redacted_redis_url`` instead.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferq.batch.config import MAX_LINE_BYTES
from inferq.connection import DEFAULT_URL, URL_ENV, redact_url
from inferq.errors import ConfigError
from inferq.protocol.keys import DEFAULT_NAMESPACE, NAME_RE
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN

ENV_PREFIX = "INFERQ_GATEWAY_"
Name = Annotated[str, Field(pattern=NAME_RE.pattern)]


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, validate_by_name=True, validate_by_alias=True, frozen=True,
        extra="forbid",
    )

    redis_url: SecretStr = Field(default=SecretStr(DEFAULT_URL), validation_alias=URL_ENV)
    token: SecretStr | None = None
    timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 60.0
    max_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 600.0
    namespace: Name = DEFAULT_NAMESPACE
    max_queue_depth: Annotated[int, Field(ge=0)] = 1_000_000
    retry_after_s: Annotated[int, Field(ge=1)] = 1
    #: 404 ``model_not_found`` for a model that no worker has ever served (not in the queue
    #: registry), instead of queueing it; false queues it anyway (workers may start later).
    require_served_model: bool = True
    max_embedding_inputs: Annotated[int, Field(ge=1)] = 2048
    #: Connections of the gateway's Redis pool (awaited results share one per queue).
    max_connections: Annotated[int, Field(ge=4)] = 64
    #: Concurrent ``/v1/embeddings`` calls share one Redis round trip per event-loop turn.
    coalesce: bool = True
    #: Plain ``/v1/embeddings`` calls skip FastAPI's per-request machinery (``fastpath``).
    fast_path: bool = True
    ready_model: Name = "minilm"
    ready_task: Name = "embed"
    #: Where a call's tenant (fair shares, ``inferq.protocol.fair``) comes from: OpenAI's ``user``
    #: field (``user``; the native route's ``tenant`` field), the ``X-Inferq-Tenant`` header
    #: (``header``), or nowhere (``none``: every call is in the default flow). The operator
    #: picks one so that callers cannot choose a source the operator does not trust.
    tenant_from: Literal["none", "user", "header"] = "none"
    #: Cache affinity: without an ``X-Session-Id`` header, OpenAI's ``user`` field names a
    #: generation's session (``inferq.protocol.prefix``).
    session_from_user: bool = False
    #: ``/readyz`` gives up on Redis after this long (the SDK's sockets never time out).
    ready_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 2.0
    # Files and batches (``inferq.batch``).
    file_store: str = Field(default_factory=lambda: os.path.expanduser("~/.inferq/files"))
    file_store_options: dict[str, Any] = Field(default_factory=dict)
    max_batch_bytes: Annotated[int, Field(ge=1)] = 200 << 20
    max_batch_lines: Annotated[int, Field(ge=1)] = 50_000
    max_batch_line_bytes: Annotated[int, Field(ge=1)] = MAX_LINE_BYTES
    batch_priority: Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)] = -50
    batch_runner: bool = True
    batch_lease_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 15.0
    batch_chunk: Annotated[int, Field(ge=1)] = 256
    batch_max_outstanding: Annotated[int, Field(ge=1)] = 4096
    #: A blocking read: at most 5 s, well inside the connections' read timeout.
    batch_idle_s: Annotated[float, Field(gt=0, le=5, allow_inf_nan=False)] = 1.0
    #: Open event streams (completions with ``stream``, resumes) on this gateway, and per
    #: tenant (callers without one, the operator, are one tenant): 429 beyond either. Streams
    #: are read by one multiplexed reader (``inferq.gateway.streams``), not a connection each.
    max_streams: Annotated[int, Field(ge=1)] = 2048
    max_streams_per_tenant: Annotated[int, Field(ge=1)] = 512

    # The front door (``frontdoor``): limits applied before a body is read.
    max_body_mb: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 16.0
    max_file_mb: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 200.0
    #: Comma-separated ``Host`` names an open gateway (no token, no key) answers; ``*``: any.
    allowed_hosts: str = "localhost,127.0.0.1,::1"

    @property
    def allowed_host_names(self) -> tuple[str, ...]:
        return tuple(h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip())

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * (1 << 20))

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            return None
        return value

    @model_validator(mode="after")
    def _timeouts_ordered(self) -> Self:
        if self.timeout_s > self.max_timeout_s:
            raise ValueError(f"timeout_s ({self.timeout_s}) must be <= max_timeout_s "
                             f"({self.max_timeout_s})")
        return self

    @classmethod
    def from_env(cls) -> GatewaySettings:
        """Settings from the environment; an ``INFERQ_GATEWAY_*`` variable that names no
        setting (a typo) is an error, not silently ignored."""
        known = {ENV_PREFIX + name.upper() for name in cls.model_fields if name != "redis_url"}
        unknown = sorted(k for k in os.environ
                         if k.upper().startswith(ENV_PREFIX) and k.upper() not in known)
        if unknown:
            raise ConfigError(f"unknown gateway setting(s) {unknown}; known: {sorted(known)}")
        return cls()

    @property
    def redacted_redis_url(self) -> str:
        return redact_url(self.redis_url.get_secret_value())
