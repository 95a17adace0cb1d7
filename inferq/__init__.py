"""inferq: a durable, priority-aware inference queue for GPU fleets, on Redis.

Producer side (light: redis, msgpack, pydantic)::

    import inferq
    handle = inferq.Client("redis://localhost:6379").enqueue("hello", model="minilm")
    print(handle.result(timeout=30).output)
"""

from __future__ import annotations

import threading
from typing import Unpack

from inferq.connection import ConnectionSettings
from inferq.errors import (
    BackendUnavailable,
    ConfigError,
    DeadlineExceeded,
    DeviceOutOfMemory,
    DurabilityError,
    InferqError,
    InvalidInput,
    ModelLoadError,
    PayloadTooLarge,
    QueuedTokensFull,
    QueueFull,
    RequestCancelled,
    RequestError,
    RequestFailed,
    ResultTimeout,
    TransientError,
    UnknownModel,
    ValidationError,
    WouldMissSlo,
)
from inferq.producer.aio import AsyncClient, AsyncHandle
from inferq.producer.client import Client, Handle
from inferq.producer.info import CancelOutcome, RequestInfo
from inferq.producer.options import ClientOptions, EnqueueOptions, Shedding
from inferq.producer.presence import NoWorkerWarning
from inferq.producer.replies import RequestState
from inferq.protocol.codec import ErrorInfo, Limits, Result, Status, Usage
from inferq.protocol.generation import FinishReason, GenerationParams
from inferq.protocol.scores import PRIORITY_MAX, PRIORITY_MIN

__version__ = "0.1.0"

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "AsyncClient",
    "AsyncHandle",
    "BackendUnavailable",
    "CancelOutcome",
    "Client",
    "ClientOptions",
    "ConfigError",
    "ConnectionSettings",
    "DeadlineExceeded",
    "DeviceOutOfMemory",
    "DurabilityError",
    "EnqueueOptions",
    "ErrorInfo",
    "FinishReason",
    "GenerationParams",
    "Handle",
    "InferqError",
    "InvalidInput",
    "Limits",
    "ModelLoadError",
    "NoWorkerWarning",
    "PayloadTooLarge",
    "QueueFull",
    "QueuedTokensFull",
    "RequestCancelled",
    "RequestError",
    "RequestFailed",
    "RequestInfo",
    "RequestState",
    "Result",
    "ResultTimeout",
    "Shedding",
    "Status",
    "TransientError",
    "UnknownModel",
    "Usage",
    "ValidationError",
    "WouldMissSlo",
    "default_client",
    "enqueue",
]

_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client on ``INFERQ_REDIS_URL`` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def enqueue(prompt: str = "", **request: Unpack[EnqueueOptions]) -> Handle:
    """``Client.enqueue`` (same arguments, ``EnqueueOptions``) on the default client
    (``INFERQ_REDIS_URL``)."""
    return default_client().enqueue(prompt, **request)
