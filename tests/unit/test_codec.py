from __future__ import annotations

import math

import msgpack
import pytest

import inferq
from inferq.errors import PayloadTooLarge, ValidationError
from inferq.protocol.codec import (
    Limits,
    Result,
    Status,
    build_request,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)

LIMITS = Limits(max_prompt_bytes=128, max_params_bytes=256, max_payload_bytes=1024)


def _request(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = dict(id="r1", model="minilm", task="embed", priority=0,
                                   deadline_s=None, params=None, max_attempts=3)
    base.update(overrides)
    return base


def test_request_round_trip_is_msgpack_not_pickle() -> None:
    payload = build_request("hello", **_request(priority=7, params={"k": [1, 2]}))
    data = encode_request(payload)
    assert msgpack.unpackb(data)["prompt"] == "hello"
    assert decode_request(data) == payload


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"priority": 1000}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"deadline_s": math.nan}, "deadline_s"),
        ({"deadline_s": math.inf}, "deadline_s"),
        ({"deadline_s": -1.0}, "deadline_s"),
        ({"id": "bad id with spaces"}, "id"),
        ({"model": "../etc"}, "model"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"params": {"k": object()}}, "params"),
    ],
)
def test_bad_request_fields_are_named_in_the_error(overrides: dict[str, object],
                                                   field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        build_request("hello", **_request(**overrides))


def test_prompt_must_be_text() -> None:
    with pytest.raises(ValidationError, match="prompt"):
        build_request(b"bytes", **_request())


def test_size_limits_are_checked_before_queueing() -> None:
    limits = Limits(max_prompt_bytes=10, max_params_bytes=20)
    with pytest.raises(PayloadTooLarge, match="prompt"):
        encode_request(build_request("x" * 11, **_request()), limits)
    with pytest.raises(PayloadTooLarge, match="params"):
        encode_request(build_request("ok", **_request(params={"k": "y" * 40})), limits)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01", msgpack.packb({"id": "x"}),
                                  msgpack.packb([1, 2, 3]), b"\xa5hello"])
def test_malformed_payload_bytes_give_a_typed_error(data: bytes) -> None:
    with pytest.raises(ValidationError):
        decode_request(data)


def test_result_round_trip_and_derived_timings() -> None:
    result = Result(id="r1", status=Status.OK, output=[0.5, -0.25], attempts=1,
                    enqueued_ms=1000, started_ms=1040, finished_ms=1100, compute_ms=55.0)
    back = decode_result(encode_result(result))
    assert back == result
    assert back.queue_wait_ms == 40.0
    assert back.total_ms == 100.0


def test_result_written_by_lua_decodes() -> None:
    # The Lua scripts build error results with cmsgpack: a map with these keys.
    raw = msgpack.packb({"v": 1, "id": "r1", "status": "dead",
                         "error": {"code": "max_attempts", "message": "m"},
                         "attempts": 3, "enqueued_ms": 1, "finished_ms": 2})
    result = decode_result(raw)
    assert result.status is Status.DEAD
    assert result.error is not None and result.error.code == "max_attempts"


# Regression: decode_request once checked max_payload_bytes and max_prompt_bytes but not
# max_params_bytes, so a worker ran a request whose params exceeded the producer's limit.
def test_worker_side_decode_enforces_the_params_limit() -> None:
    body = {"v": 1, "id": "r1", "task": "embed", "model": "t", "prompt": "x",
            "params": {"k": "v" * (LIMITS.max_params_bytes + 10)}}
    data = msgpack.packb(body)
    assert len(data) <= LIMITS.max_payload_bytes
    with pytest.raises(inferq.PayloadTooLarge):
        decode_request(data, LIMITS)
