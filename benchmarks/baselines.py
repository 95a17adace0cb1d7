"""The no-op job and worker settings for the ``arq`` and ``rq`` baselines of ``overhead``.

Their own standard workers import this module by name (``arq benchmarks.baselines.ArqSettings``,
``rq worker`` running ``benchmarks.baselines.noop``), so it stays tiny; it imports arq only to
build arq's settings, and works without arq installed (for rq).

arq's worker takes its settings from a class; the benchmark passes the server URL and the
tuning (``max_jobs``, ``poll_delay``) through environment variables, since the arq CLI takes no
such options.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

ARQ_URL_ENV = "INFERQ_BENCH_ARQ_URL"
ARQ_MAX_JOBS_ENV = "INFERQ_BENCH_ARQ_MAX_JOBS"
ARQ_POLL_DELAY_ENV = "INFERQ_BENCH_ARQ_POLL_DELAY"
#: arq's own defaults (``Worker(max_jobs=10, poll_delay=0.5)``).
ARQ_DEFAULT_MAX_JOBS = 10
ARQ_DEFAULT_POLL_DELAY = 0.5


def noop(*args: Any, **kwargs: Any) -> None:
    """The rq job: does nothing."""
    return None


async def arq_noop(ctx: dict[str, Any], *args: Any) -> None:
    """The arq job: does nothing (arq passes its context first)."""
    return None


def _arq_redis_settings() -> Any:
    try:
        from arq.connections import RedisSettings
    except ImportError:  # rq imports this module too, where arq may be absent
        return None
    return RedisSettings.from_dsn(os.environ.get(ARQ_URL_ENV, "redis://127.0.0.1:6379/1"))


class ArqSettings:
    """``arq benchmarks.baselines.ArqSettings``: the standard arq worker, no-op job."""

    functions: ClassVar[list[Any]] = [arq_noop]
    redis_settings = _arq_redis_settings()
    max_jobs = int(os.environ.get(ARQ_MAX_JOBS_ENV, ARQ_DEFAULT_MAX_JOBS))
    poll_delay = float(os.environ.get(ARQ_POLL_DELAY_ENV, ARQ_DEFAULT_POLL_DELAY))
    # Results are kept (arq's default, one hour): the benchmark reads their finish times.
    health_check_interval = 3600
