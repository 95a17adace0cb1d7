"""Tiny random models for tests and benchmarks (``tiny``); the generate worker itself lives in
``inferq.worker.generate``."""
