"""``inferq worker --task generate --engine vllm``: vLLM's engine behind inferq's step loop.

The worker process is the same as with the transformers engine (claims, leases, streams,
results, cancellation, metrics); in the engine process ``engine.VllmEngine`` stands where
``generate.engine.Engine`` stands, driven by the same ``StepLoop``. The pure parts (which
sampling parameters map, the engine options, the capacity read from vLLM's scheduler) import
nothing of vLLM and are tested without it.
"""
