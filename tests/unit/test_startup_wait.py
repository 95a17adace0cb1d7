"""A starting worker rides out a server that may be restarting (``backoff.ride_out``,
``may_pass``): refused, closed or timed-out connections and LOADING are asked again for a
bound; a refused password, a TLS failure or any other error is not."""

from __future__ import annotations

import ssl
import time

import pytest
import redis

from inferq.errors import BackendUnavailable
from inferq.worker.core.backoff import may_pass, ride_out


def wrapped(cause: BaseException) -> BackendUnavailable:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise BackendUnavailable("cannot connect", url="redis://x") from exc
    except BackendUnavailable as outer:
        return outer


@pytest.mark.parametrize(("exc", "passes"), [
    (redis.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (redis.ConnectionError("Connection closed by server."), True),
    (redis.TimeoutError("Timeout reading from socket"), True),
    (wrapped(ConnectionRefusedError(111, "Connection refused")), True),
    (wrapped(ssl.SSLError("CERTIFICATE_VERIFY_FAILED")), False),
    (redis.AuthenticationError("invalid username-password pair"), False),
    (redis.ResponseError("NOSCRIPT"), False),
    (ValueError("bug"), False),
])
def test_what_may_pass(exc: BaseException, passes: bool) -> None:
    assert may_pass(exc) is passes


async def test_a_step_is_asked_again_while_the_server_loads() -> None:
    calls: list[float] = []

    async def step() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise redis.BusyLoadingError("Redis is loading the dataset in memory")
        return "up"

    assert await ride_out(step, "test", wait_s=30) == "up"
    assert len(calls) == 3


async def test_a_refused_password_fails_at_once() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise redis.AuthenticationError("invalid username-password pair")

    with pytest.raises(redis.AuthenticationError):
        await ride_out(step, "test", wait_s=30)
    assert calls == 1


async def test_a_server_that_stays_away_fails_after_the_bound() -> None:
    async def step() -> None:
        raise redis.ConnectionError("Error 111 connecting. Connection refused.")

    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        await ride_out(step, "test", wait_s=0.3)
    assert 0.1 <= time.monotonic() - started < 5
