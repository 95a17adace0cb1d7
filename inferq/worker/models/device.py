"""Device and dtype resolution (imports torch: worker side only)."""

from __future__ import annotations

import torch

from inferq.errors import ConfigError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but torch sees no CUDA device")
    if requested not in ("cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, got {requested!r}")
    return torch.device(requested)


def resolve_dtype(requested: str, device: torch.device, *, probe: bool = True) -> torch.dtype:
    """``auto``: bfloat16 on GPUs that support it, else float16 on CUDA; float32 on the CPU
    (half precision is slower than float32 on most CPUs). Without ``probe``, ``auto`` on CUDA
    is taken as bfloat16 without asking the GPU (which would create a CUDA context in this
    process): for a process that holds no weights, where the dtype only sizes estimates."""
    if requested != "auto":
        if requested not in _DTYPES:
            raise ConfigError(
                f"dtype must be auto, float32, float16 or bfloat16, got {requested!r}")
        return _DTYPES[requested]
    if device.type == "cuda":
        if not probe:
            return torch.bfloat16
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32
