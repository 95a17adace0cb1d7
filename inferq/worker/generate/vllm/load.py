"""Starting vLLM's engine in the engine process (the one module that imports vLLM).

``LLMEngine`` runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the engine process is
already a process of its own, and the step loop steps it. A stat logger passes vLLM's
scheduler state and preemptions to ``VllmStats`` after each step. The budget the worker claims
under comes from vLLM's configuration once its KV cache is allocated: ``max_num_seqs`` slots,
and its KV blocks x block size tokens. Then one full burst runs through it (``warmup``)
before it is handed to the step loop.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from inferq.errors import ConfigError
from inferq.worker.generate.scheduler import Budget
from inferq.worker.generate.settings import CPU_KV_CACHE_MB, GenerationSettings
from inferq.worker.generate.vllm.capacity import SchedulerState
from inferq.worker.generate.vllm.engine import Requests, VllmEngine, VllmStats
from inferq.worker.generate.vllm.options import ENVIRONMENT, cpu_kvcache_gib, engine_kwargs
from inferq.worker.generate.vllm.warmup import WARM_UP_TOKENS, warm_up
from inferq.worker.models.lm import CausalLM

log = logging.getLogger("inferq.worker")


def vllm_available() -> bool:
    """Whether vLLM can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def prepare_environment(settings: GenerationSettings, device: str) -> None:
    """vLLM's environment, before it is imported (a variable already set wins)."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if not device.startswith("cuda"):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE",
                              str(cpu_kvcache_gib(settings.kv_cache_mb, CPU_KV_CACHE_MB)))


def start_vllm(lm: CausalLM, *, path: str, dtype: str, device: str,
               settings: GenerationSettings, options: dict[str, Any]
               ) -> tuple[VllmEngine, float]:
    """vLLM's engine on ``path``, wrapped for the step loop; and how long it took to start."""
    started = time.monotonic()
    prepare_environment(settings, device)
    from vllm import EngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    stats = VllmStats()

    class _Recorder(StatLoggerBase):  # type: ignore[misc]  # vLLM's types are Any here
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            state = None if scheduler_stats is None else SchedulerState(
                running=scheduler_stats.num_running_reqs,
                waiting=scheduler_stats.num_waiting_reqs,
                kv_usage=float(scheduler_stats.kv_cache_usage))
            preempted = 0 if iteration_stats is None else iteration_stats.num_preempted_reqs
            stats.record(state, preempted)

        def log_engine_initialized(self) -> None:
            pass

    kwargs = engine_kwargs(model=path, dtype=dtype, max_slots=settings.max_slots,
                           options=options, kv_cache_mb=settings.kv_cache_mb, device=device)
    try:
        args = EngineArgs(**kwargs)
    except TypeError as exc:  # an option EngineArgs does not have
        raise ConfigError(f"--vllm-option: {exc}") from exc
    core = LLMEngine.from_engine_args(args, stat_loggers=[_Recorder])
    config = core.vllm_config
    blocks = config.cache_config.num_gpu_blocks or 0
    block_size = config.cache_config.block_size
    budget = Budget(max_slots=config.scheduler_config.max_num_seqs,
                    kv_tokens=max(1, blocks * block_size),
                    max_prefill_tokens=settings.max_prefill_tokens)

    def sampling(**kw: Any) -> Any:
        return SamplingParams(**kw, output_kind=RequestOutputKind.DELTA)

    def prompt(ids: list[int]) -> Any:
        return TokensPrompt(prompt_token_ids=ids)

    traces = bool(getattr(getattr(config, "observability_config", None),
                          "otlp_traces_endpoint", None))
    requests = Requests(sampling, prompt)
    # The burst the worker will claim, before it is advertised (``warmup``): as many prompts
    # as there are slots, together as long as one prefill step takes.
    slots = budget.max_slots
    per_slot = config.scheduler_config.max_num_batched_tokens // slots
    prompt_len = max(1, min(per_slot, config.model_config.max_model_len - WARM_UP_TOKENS - 1))
    took = warm_up(core, requests, slots=slots, prompt_len=prompt_len, token_id=0)
    log.info("vLLM warmed up on %d requests of %d prompt tokens in %.1f s", slots, prompt_len,
             took)
    engine = VllmEngine(lm, budget, core, requests, stats=stats, block_size=block_size,
                        traces=traces)
    return engine, time.monotonic() - started
