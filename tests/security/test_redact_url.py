"""``redact_url`` never shows a password, whatever reserved characters it holds (``#``, ``/``,
``?``, ``@``), percent-encoded as redis-py reads it or written raw as people paste it."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from redis.connection import parse_url

from inferq.connection import redact_url

#: Each piece between the reserved characters is long and unique: none may be shown.
PASSWORDS = ["alpha#bravo", "alpha/bravo", "alpha?bravo", "alpha@bravo",
             "alpha#bravo/charlie?delta@echo", "#alpha/?bravo@", "alpha&bravo=charlie"]


def pieces(password: str) -> list[str]:
    return [p for p in password.replace("#", " ").replace("/", " ").replace("?", " ")
            .replace("@", " ").replace("&", " ").replace("=", " ").split() if p]


def forms(password: str) -> list[tuple[str, str | None]]:
    """(URL, what must still be shown): the forms redis-py accepts (percent-encoded, in the
    userinfo or as ``?password=``), then the same password raw."""
    q = quote(password, safe="")
    raw_query = [] if "&" in password else [  # a raw '&' starts another argument
        (f"redis://cache.internal:6379/0?password={password}", "cache.internal:6379/0")]
    return [
        (f"redis://:{q}@cache.internal:6379/0", "cache.internal:6379/0"),
        (f"redis://app:{q}@cache.internal:6379/0", "redis://app:***@cache.internal:6379/0"),
        (f"rediss://app:{q}@cache.internal:6380/0?ssl_cert_reqs=required",
         "cache.internal:6380/0?ssl_cert_reqs=required"),
        (f"unix://:{q}@/run/redis.sock?db=0", "/run/redis.sock?db=0"),
        (f"redis://cache.internal:6379/0?password={q}", "cache.internal:6379/0?password=***"),
        (f"redis://cache.internal:6379/0?db=0&password={q}&x=1", "cache.internal:6379/0?db=0"),
        (f"redis://:{password}@cache.internal:6379/0", None),
        (f"redis://app:{password}@cache.internal:6379/0", None),
        (f"unix://:{password}@/run/redis.sock?db=0", None),
        *raw_query,
    ]


@pytest.mark.parametrize("password", PASSWORDS)
def test_redacted_url_never_contains_the_password(password: str) -> None:
    for url, shown in forms(password):
        redacted = redact_url(url)
        assert password not in redacted, (url, redacted)
        assert quote(password, safe="") not in redacted, (url, redacted)
        for piece in pieces(password):
            assert piece not in redacted, (url, redacted, piece)
        assert "***" in redacted, (url, redacted)
        if shown is not None:
            assert shown in redacted, (url, redacted)


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_percent_encoded_forms_are_what_redis_py_reads(password: str) -> None:
    """The encoded forms tested above carry exactly this password to redis-py."""
    for url, _ in forms(password)[:6]:
        if not url.startswith("unix://"):
            assert parse_url(url)["password"] == password, url
