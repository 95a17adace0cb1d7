"""What an exception in a model becomes: a ``Failure`` (stable code, retryable or not) for the
request's result. Out-of-memory errors are recognised without importing torch, and the
device's cached blocks are handed back after one."""

from __future__ import annotations

from dataclasses import dataclass

from inferq.errors import MODEL_ERROR, DeviceOutOfMemory, InferqError
from inferq.protocol.codec import ErrorInfo


@dataclass(frozen=True, slots=True)
class Failure:
    error: ErrorInfo
    retryable: bool


def is_out_of_memory(exc: BaseException) -> bool:
    """``DeviceOutOfMemory``, or torch's own out-of-memory error (``torch.OutOfMemoryError``,
    which ``torch.cuda.OutOfMemoryError`` names), recognised without importing torch."""
    if isinstance(exc, DeviceOutOfMemory):
        return True
    return any(cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch")
               for cls in type(exc).__mro__)


def failure_of(exc: BaseException) -> Failure:
    if is_out_of_memory(exc) and not isinstance(exc, InferqError):
        exc = DeviceOutOfMemory(str(exc).splitlines()[0] if str(exc) else "out of memory")
    if isinstance(exc, InferqError):
        code, retryable = exc.code, exc.retryable
    else:
        # An unexpected exception may be transient (a CUDA hiccup); retries are bounded by the
        # request's max_attempts, after which it is dead-lettered with this error.
        code, retryable = MODEL_ERROR, True
    return Failure(ErrorInfo(code=code, message=f"{type(exc).__name__}: {exc}"[:2000]),
                   retryable)


def free_device_cache(device: str) -> None:
    """Hand torch's cached, unused blocks back to the device after an out-of-memory error, so
    the smaller retry does not fail on fragmentation."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
