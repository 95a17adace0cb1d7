"""The error tree's loose ends: ``BackendUnavailable`` for a server nobody answers at,
``UnknownModel`` for a model the registry does not know, and ``enqueue``'s one signature."""

from __future__ import annotations

import pydoc
from collections.abc import Callable
from typing import Any

import pytest
import redis

import inferq
from inferq.embedded import free_port
from inferq.producer.options import ENQUEUE_KEYS
from inferq.worker.models.registry import load_model, parse_model_arg

NOWHERE = inferq.ConnectionSettings(f"redis://:secret@127.0.0.1:{free_port()}/0", retries=0)


def _unavailable(failure: pytest.ExceptionInfo[Any]) -> None:
    exc = failure.value
    assert isinstance(exc, inferq.BackendUnavailable) and exc.code == "backend_unavailable"
    # Code written against redis-py's errors keeps catching it.
    assert isinstance(exc, redis.ConnectionError | redis.TimeoutError)
    assert exc.message.startswith("cannot connect at redis://:***@127.0.0.1:")
    assert exc.url == NOWHERE.redacted_url and "secret" not in str(exc)


@pytest.mark.parametrize("call", [
    lambda c: c.enqueue("x", model="m"),
    lambda c: c.enqueue_many(["x", "y"], model="m"),
    lambda c: c.handle("r1", model="m").result(timeout=1),
    lambda c: c.handle("r1", model="m").status(),
    lambda c: c.handle("r1", model="m").cancel(),
    lambda c: list(c.handle("r1", model="m").stream(timeout=1)),
])
def test_the_sync_sdk_raises_backend_unavailable(call: Callable[[inferq.Client], Any]) -> None:
    with inferq.Client(NOWHERE) as client, pytest.raises(redis.ConnectionError) as failure:
        call(client)
    _unavailable(failure)


async def test_the_async_sdk_raises_backend_unavailable() -> None:
    async with inferq.AsyncClient(NOWHERE) as client:
        with pytest.raises(inferq.BackendUnavailable) as failure:
            await client.enqueue("x", model="m")
        _unavailable(failure)
        with pytest.raises(inferq.InferqError) as failure:
            await client.handle("r1", model="m").peek()
        _unavailable(failure)


def test_an_unknown_builtin_model_is_unknown_model() -> None:
    with pytest.raises(inferq.ConfigError) as failure:  # still a ConfigError, as before
        load_model(parse_model_arg("x=builtin:nope"), "embed")
    assert isinstance(failure.value, inferq.UnknownModel) and failure.value.code == "unknown_model"


def test_enqueue_is_typed_once_and_help_names_every_argument() -> None:
    text = pydoc.render_doc(inferq.Client.enqueue)
    assert all(f"``{name}``" in text for name in ENQUEUE_KEYS), text
    client = inferq.Client(NOWHERE)
    with pytest.raises(TypeError, match="unexpected keyword argument 'priorty'"):
        client.enqueue("x", model="m", priorty=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'model'"):
        client.enqueue("x")  # type: ignore[call-arg]
    client.close()


def test_a_deadline_recorded_by_a_worker_has_no_result_to_read() -> None:
    error = inferq.DeadlineExceeded("the deadline passed before the request could run")
    assert error.code == "deadline_exceeded"
    with pytest.raises(RuntimeError, match="without a stored result"):
        _ = error.result
