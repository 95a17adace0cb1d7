"""The window worker: requests claimed in adaptive windows and run as whole batches (``embed``,
``score``, request-level ``generate``). ``worker`` (collector and executor); ``policy`` (when
the batching window closes, pure); ``packing`` (which requests form a batch); ``memory`` (the
out-of-memory token budget); ``isolation`` (bisecting a failed batch); ``batch`` (``Job``,
``Batch``); ``stats``.
"""
