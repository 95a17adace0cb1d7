"""A ``Last-Event-ID`` that the stream cannot have sent (past its end, or numbers XREAD
refuses) is a clear 4xx before the stream starts: never an empty 200, never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

import inferq
from inferq.producer.options import ClientOptions
from inferq.protocol.fields import StreamField
from inferq.protocol.keys import QueueKeys
from tests.support.gateway import MakeApi
from tests.support.generation import MODEL

REQUEST = "resume-range"
STREAM = f"/v1/requests/{REQUEST}/stream"


@pytest.fixture
def entries(redis_url: str, r: redis.Redis) -> list[str]:
    """A queued generation (no worker) whose stream holds two deltas: their entry ids."""
    with inferq.Client(redis_url, options=ClientOptions(warn_no_worker=False)) as client:
        client.enqueue("the queue", model=MODEL, task="generate", id=REQUEST)
    key = QueueKeys.for_model("generate", MODEL).stream(REQUEST)
    ids = [r.xadd(key, {StreamField.ATTEMPT: 1, StreamField.TEXT: text})
           for text in ("first", "second")]
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]


@pytest.fixture
def api(make_api: MakeApi) -> Iterator[TestClient]:
    with make_api() as client:
        yield client


def resume(api: TestClient, last_event_id: str) -> tuple[int, dict[str, str], str]:
    with api.stream("GET", STREAM, params={"model": MODEL},
                    headers={"Last-Event-ID": last_event_id, "X-Timeout-S": "1"}) as response:
        text = "".join(response.iter_text())
    return response.status_code, dict(response.headers), text


@pytest.mark.parametrize(("last_event_id", "status"), [
    ("18446744073709551616-0", 422),  # 2^64: matches the pattern, XREAD refuses it
    ("0-99999999999999999999", 422),
    ("18446744073709551615-18446744073709551615", 416),  # the largest id: past the end
    ("99999999999999-0", 416),
    ("99999999999999-0:f", 416),
])
def test_an_out_of_range_last_event_id_is_a_clear_4xx(
        api: TestClient, entries: list[str], last_event_id: str, status: int,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    code, headers, text = resume(api, last_event_id)
    assert code == status, text
    assert headers["content-type"].startswith("application/json")
    assert f"{last_event_id!r}" in text and "Last-Event-ID" in text
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_a_tail_id_before_the_last_entry_is_refused(api: TestClient,
                                                    entries: list[str]) -> None:
    """``:f`` follows the stream's last entry only: after the first of two it cannot be."""
    code, _, text = resume(api, f"{entries[0]}:f")
    assert code == 416 and "last_event_id_out_of_range" in text


def test_an_id_in_range_resumes_after_it(api: TestClient, entries: list[str]) -> None:
    code, _, text = resume(api, entries[0])  # the request stays queued: ends by timeout
    assert code == 200
    assert "second" in text and "first" not in text and f"id: {entries[1]}" in text
    # Leading zeros are the same id, not a different position.
    ms, _, seq = entries[0].partition("-")
    code, _, text = resume(api, f"000{ms}-0{seq}")
    assert code == 200 and "second" in text and "first" not in text
    code, _, text = resume(api, entries[1])
    assert code == 200 and "second" not in text and "result_timeout" in text
