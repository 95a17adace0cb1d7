"""OpenAI's rate-limit headers for an ``Admission``: ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests`` (and the same for tokens),
only for the limits the key has, and ``Retry-After`` (whole seconds) on a refusal.

Resets are durations as OpenAI writes them (Go's ``time.Duration``): ``20ms``, ``1s``,
``1.5s``, ``6m0s``, ``1h0m0s``.
"""

from __future__ import annotations

from inferq.tenancy.limits import Admission


def duration(ms: int) -> str:
    """``ms`` as OpenAI's reset headers write a duration."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    sec = f"{seconds}.{millis:03d}".rstrip("0").rstrip(".") if millis else str(seconds)
    if hours:
        return f"{hours}h{minutes}m{sec}s"
    if minutes:
        return f"{minutes}m{sec}s"
    return f"{sec}s"


def rate_limit_headers(admission: Admission) -> dict[str, str]:
    """The headers for a response (a success or the 429 of a refusal)."""
    out: dict[str, str] = {}
    if admission.requests_limit is not None:
        out["x-ratelimit-limit-requests"] = str(admission.requests_limit)
        out["x-ratelimit-remaining-requests"] = str(admission.requests_remaining)
        out["x-ratelimit-reset-requests"] = duration(admission.requests_reset_ms)
    if admission.tokens_limit is not None:
        out["x-ratelimit-limit-tokens"] = str(admission.tokens_limit)
        out["x-ratelimit-remaining-tokens"] = str(admission.tokens_remaining)
        out["x-ratelimit-reset-tokens"] = duration(admission.tokens_reset_ms)
    if not admission.admitted:
        out["Retry-After"] = str(max(1, admission.retry_after_s))
    return out
