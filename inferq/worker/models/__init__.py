"""Model adapters, independent of how they are batched. ``base`` (the ``BatchModel``
interface); ``registry`` (``--model NAME[=SPEC]`` to a loaded model); ``builtin`` (echo,
sleep); ``embedding``; ``lm`` (a causal LM and its tokenizer); ``batch_models`` (``score`` and
request-level ``generate``); ``detok`` and ``sampling`` (text and token choice, shared with
the generate engine); ``convert`` (SmolLM2 GGUF to safetensors); ``device``.
"""
