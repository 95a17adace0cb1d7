"""How inferq builds vLLM's ``EngineArgs``: from the worker's flags, plus ``--vllm-option``.

Pure code (no vLLM import). inferq owns the arguments that its queue guarantees depend on:
the model, ``max_num_seqs`` (``--max-slots``: the worker claims for these slots only),
``scheduling_policy="priority"`` (inferq priorities map onto vLLM's), ``dtype`` (``--dtype``)
and the in-process engine. Automatic prefix caching is on (``enable_prefix_caching=True``:
cache affinity sends a worker the requests whose prefixes it served) unless
``--vllm-option enable_prefix_caching=false`` turns it off. Options that would break a
guarantee are refused: speculative decoding (several tokens per step; the step loop streams
one per sequence and step). Everything else (``tensor_parallel_size``,
``pipeline_parallel_size``, ``gpu_memory_utilization``, ``enforce_eager``,
``max_model_len``, ...) passes through unchanged to ``EngineArgs``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from inferq.errors import ConfigError

#: ``EngineArgs`` fields set from inferq's own flags (``--vllm-option`` may not set them).
OWNED = {"model": "--model", "max_num_seqs": "--max-slots", "dtype": "--dtype",
         "scheduling_policy": "(always priority)", "tokenizer": "--model"}
#: ``EngineArgs`` fields refused, with why.
REFUSED = {"speculative_config": "speculative decoding emits several tokens per step; inferq's "
                                 "step loop streams one token per sequence and step"}
#: vLLM's environment, set in the engine process before vLLM is imported: the engine core runs
#: in-process (the engine process is already a process of its own, stepped by the step loop).
ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as ``EngineArgs`` keyword arguments: VALUE is read as JSON when it
    is JSON (``2``, ``true``, ``{"a": 1}``), else as a string. Keys are checked here (format,
    owned, refused, repeated); whether vLLM knows them is checked where it is imported."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--vllm-option {pair!r}: expected KEY=VALUE, e.g. "
                              "tensor_parallel_size=2")
        if key in OWNED:
            raise ConfigError(f"--vllm-option {key}: set by inferq ({OWNED[key]})")
        if key in REFUSED:
            raise ConfigError(f"--vllm-option {key}: refused: {REFUSED[key]}")
        if key in options:
            raise ConfigError(f"--vllm-option {key}: given twice")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def engine_kwargs(*, model: str, dtype: str, max_slots: int, options: Mapping[str, Any],
                  kv_cache_mb: float | None, device: str) -> dict[str, Any]:
    """``EngineArgs(**engine_kwargs(...))``. ``kv_cache_mb`` on CUDA becomes
    ``kv_cache_memory_bytes``; on the CPU, vLLM sizes its cache from ``cpu_kvcache_gib``
    (``VLLM_CPU_KVCACHE_SPACE``) instead."""
    kwargs: dict[str, Any] = {"model": model, "dtype": dtype, "max_num_seqs": max_slots,
                              "scheduling_policy": "priority", "enable_prefix_caching": True,
                              **options}
    if kv_cache_mb is not None and device.startswith("cuda"):
        kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_mb * 2**20))
    return kwargs


def cpu_kvcache_gib(kv_cache_mb: float | None, default_mb: int) -> int:
    """``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, at least 1) for inferq's CPU KV budget."""
    return max(1, math.ceil((kv_cache_mb or default_mb) / 1024))
