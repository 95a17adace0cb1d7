"""The worker: claims windows of requests, runs them as batches, writes each result.

Needs ``inferq[worker]`` (torch, transformers) for real models; the built-in ``echo`` and
``sleep`` models run without them.
"""
