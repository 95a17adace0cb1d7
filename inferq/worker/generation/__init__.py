"""Text generation and scoring with causal LMs: iteration-level (continuous) batching.

Layout: ``lm`` (model + tokenizer, chat templates), ``kvcache`` (slot KV cache), ``engine``
(one decode iteration over the running sequences), ``scheduler`` (admission policy, pure),
``sampling`` and ``detok`` (per-request decoding), ``steploop`` (the model thread),
``worker`` (the Redis side: claims, streams, results), ``batch_models`` (``score`` and
request-level ``generate`` for the window worker), ``convert`` (SmolLM2 GGUF to safetensors).
"""
