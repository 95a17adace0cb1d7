"""How a ``generate`` worker batches (``inferq worker --task generate``), and the token budget
of its KV cache on the device it runs on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferq.errors import ConfigError
from inferq.worker.generate.scheduler import Budget
from inferq.worker.models.lm import CausalLM, KVShape, WeightsNotLoaded

#: KV cache budget on a CPU when none is given. Never derived from the host's RAM: a worker
#: shares its machine, and a cache sized from all of it would starve everything else.
CPU_KV_CACHE_MB = 1024
#: Share of the free device memory (after loading the model) the KV cache may take on CUDA.
CUDA_KV_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    #: Sequences decoded together in one step.
    max_slots: int = 16
    #: KV cache budget in MiB; None sizes it for the device (CUDA: half the free memory after
    #: loading; CPU: ``CPU_KV_CACHE_MB``).
    kv_cache_mb: float | None = None
    #: Prompt tokens prefilled in one step (the first admission of a step always runs).
    max_prefill_tokens: int = 2048
    #: Stream writes (and result writes) happen at most this often; the steps in between
    #: are merged into one write. Adds up to this much to TTFT (cancellations do not wait for
    #: it: they are pushed to the worker). Each write costs the event loop GIL time the model
    #: thread waits for: 25 ms gave the tiny model more tokens/s than 10 ms on the 2-core CPU.
    stream_interval_ms: float = 25.0
    #: Run the model, KV cache and step loop in a child process (``engine_process``) instead
    #: of a thread of the worker process, so that the step loop never waits for the GIL the
    #: event loop holds. The weights load only there (the worker process loads the tokenizer
    #: and configs: ``CausalLM(weights=False)``), and the KV budget is sized there after them.
    #: On by default (the ``generate`` benchmark's ``process`` variant, benchmarks/RESULTS.md).
    engine_process: bool = True
    #: How many times one sequence may be preempted for a higher priority (then it keeps its
    #: slot until it finishes); 0 turns preemption off (see ``scheduler.plan``).
    max_preemptions: int = 32
    #: Host memory in MiB for the KV caches of preempted sequences, swapped out while they
    #: wait (a preemption beyond it is recomputed when the sequence resumes); None: as much as
    #: the KV cache budget; 0: always recompute.
    swap_mb: float | None = None
    #: The engine that runs the model: ``transformers`` (inferq's own KV-cache loop) or
    #: ``vllm`` (vLLM's ``LLMEngine`` in the engine process, ``generate.vllm``), and the
    #: vLLM ``EngineArgs`` passed through (``--vllm-option``, ``vllm.options``).
    engine: str = "transformers"
    #: The transformers engine's prefix cache (``prefixcache``) in MiB: the KV of prompt
    #: prefixes it computed, reused by later prompts that start with them; also bounded by
    #: what the running sequences leave of the KV budget. 0 turns it off.
    prefix_cache_mb: float = 256.0
    vllm_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.engine not in ("transformers", "vllm"):
            raise ConfigError(f"engine must be transformers or vllm, got {self.engine!r}")
        if self.engine == "vllm":
            if not self.engine_process:
                raise ConfigError("engine_process: the vllm engine runs in the engine process "
                                  "(--no-engine-process is for the transformers engine)")
            if self.swap_mb is not None:
                raise ConfigError("swap_mb: the vllm engine keeps no swapped caches (a "
                                  "preempted generation is recomputed from its tokens)")
        elif self.vllm_options:
            raise ConfigError("vllm_options: only the vllm engine takes vLLM options")
        if self.max_slots < 1:
            raise ConfigError(f"max_slots must be >= 1, got {self.max_slots}")
        if self.kv_cache_mb is not None and not self.kv_cache_mb > 0:
            raise ConfigError(f"kv_cache_mb must be > 0, got {self.kv_cache_mb}")
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if not 0 <= self.max_preemptions <= 1000:
            raise ConfigError(f"max_preemptions must be in [0, 1000], got {self.max_preemptions}")
        if not self.prefix_cache_mb >= 0:
            raise ConfigError(f"prefix_cache_mb must be >= 0, got {self.prefix_cache_mb}")
        if self.swap_mb is not None and not self.swap_mb >= 0:
            raise ConfigError(f"swap_mb must be >= 0, got {self.swap_mb}")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise ConfigError(
                f"stream_interval_ms must be in [0, 1000], got {self.stream_interval_ms}")

    def budget(self, lm: CausalLM) -> Budget:
        """The budget on ``lm``'s device. On CUDA (no ``kv_cache_mb``) it is sized from the
        memory free now, so it is computed after the weights load, where they load: the worker
        process, or the engine process (``engine_process``)."""
        if self.kv_cache_mb is not None:
            cache_bytes = int(self.kv_cache_mb * 2**20)
        elif lm.torch_device.type == "cuda":
            if not lm.has_weights:
                raise WeightsNotLoaded(
                    "the KV budget on CUDA is sized from the memory free after the weights "
                    "load: compute it where they are loaded (the engine process)")
            import torch

            free, _total = torch.cuda.mem_get_info(lm.torch_device)
            cache_bytes = int(free * CUDA_KV_FRACTION)
        else:
            cache_bytes = CPU_KV_CACHE_MB * 2**20
        return Budget(max_slots=self.max_slots,
                      kv_tokens=max(1, cache_bytes // lm.kv.bytes_per_token),
                      max_prefill_tokens=self.max_prefill_tokens)

    @property
    def prefix_cache_bytes(self) -> int:
        return int(self.prefix_cache_mb * 2**20)

    @property
    def swap_bytes(self) -> int | None:
        """``swap_mb`` in bytes (None: as much as the KV budget, see ``StepLoop``)."""
        return None if self.swap_mb is None else int(self.swap_mb * 2**20)

    def provisional_budget(self, lm: CausalLM) -> Budget:
        """What the worker process holds until the engine process, having loaded the weights,
        sends the budget it sized (``engine_process``): the slots and prefill as set, and room
        for every slot's whole context. Never a limit: the worker claims nothing before the
        engine process is ready, and publishes no budget meanwhile."""
        return Budget(max_slots=self.max_slots, kv_tokens=self.max_slots * lm.max_positions,
                      max_prefill_tokens=self.max_prefill_tokens)


def describe_budget(budget: Budget, kv: KVShape) -> str:
    return (f"generation budget: {budget.max_slots} slots, {budget.kv_tokens} KV tokens "
            f"({budget.kv_tokens * kv.bytes_per_token / 2**20:.0f} MiB), "
            f"{budget.max_prefill_tokens} prefill tokens/step")
