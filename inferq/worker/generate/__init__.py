"""The generate worker: iteration-level (continuous) batching with token streams. ``worker``
(lifecycle hooks and claiming); ``publisher`` (stream and result writes); ``steploop`` (the
model thread); ``engine`` (one decode step over the running sequences); ``scheduler``
(admission, pure); ``kvcache`` (the slot KV cache); ``settings``; ``stats``.
"""
