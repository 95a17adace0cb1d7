"""The worker decodes a claimed window in one pydantic call (``decode_requests``); it must
accept, convert and refuse exactly what decoding each payload alone through ``RequestPayload``
(the reference below: ``decode_request`` as it was) does, with the same error codes and
messages, whatever the neighbours in the window."""

from __future__ import annotations

import uuid
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from inferq.errors import PayloadTooLarge, ValidationError
from inferq.protocol.codec import (
    Limits,
    RequestPayload,
    build_request,
    decode_request,
    decode_requests,
    encode_request,
    pack,
    unpack,
)
from tests.integration.test_property_raw_payloads import LIMITS, cases, ok_text, render


def reference(data: bytes, limits: Limits) -> RequestPayload | ValidationError:
    """``decode_request`` before the batch path: one ``model_validate`` per payload."""
    try:
        raw = unpack(data, max_bytes=limits.max_payload_bytes)
        try:
            payload = RequestPayload.model_validate(raw)
        except PydanticValidationError as exc:
            raise ValidationError.from_pydantic("invalid request payload: ", exc) from exc
        if payload.text_bytes > limits.max_prompt_bytes:
            raise PayloadTooLarge(f"prompt exceeds the {limits.max_prompt_bytes}-byte limit")
        if payload.params and len(pack(payload.params)) > limits.max_params_bytes:
            raise PayloadTooLarge(f"params exceed the {limits.max_params_bytes}-byte limit")
    except ValidationError as exc:
        return exc
    return payload


def _base(prompt: str) -> dict[str, Any]:
    # The prompt is set on the wire: the SDK refuses an empty one, a raw producer may not.
    payload = build_request("x", id=uuid.uuid4().hex, task="embed", model="t")
    decoded: dict[str, Any] = msgpack.unpackb(encode_request(payload, LIMITS))
    decoded["prompt"] = prompt
    return decoded


def _agree(got: RequestPayload | ValidationError, want: RequestPayload | ValidationError) -> str:
    if isinstance(want, ValidationError):
        assert isinstance(got, ValidationError), f"accepted what the reference refuses: {want}"
        assert (type(got), got.code, got.message) == (type(want), want.code, want.message)
        return want.code
    assert isinstance(got, RequestPayload), f"refused what the reference accepts: {got}"
    # Compared as msgpack bytes: equal values, types and order, and NaN equals NaN there.
    assert msgpack.packb(got.model_dump()) == msgpack.packb(want.model_dump())
    assert got.model_fields_set == want.model_fields_set
    return "ok"


windows = st.lists(st.one_of(st.builds(lambda p: (None, p), ok_text),
                             st.tuples(cases, ok_text)), min_size=1, max_size=8)


@settings(max_examples=600, deadline=None)
@given(window=windows)
def test_a_window_decodes_as_each_payload_alone(window: list[tuple[Any, str]]) -> None:
    datas = []
    for case, prompt in window:
        base = _base(prompt)
        datas.append(msgpack.packb(base, use_bin_type=True) if case is None
                     else render(case, base)[0])
    got = decode_requests(datas, LIMITS)
    assert len(got) == len(datas)
    for data, decoded in zip(datas, got, strict=True):
        _agree(decoded, reference(data, LIMITS))
        try:
            alone: RequestPayload | ValidationError = decode_request(data, LIMITS)
        except ValidationError as exc:
            alone = exc
        _agree(alone, reference(data, LIMITS))


# Sizes at and around the shortcut bounds of the prompt and params limits.
TIGHT = Limits(max_prompt_bytes=40, max_params_bytes=60, max_payload_bytes=4096)
params_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                          st.floats(width=32), st.text(max_size=12), st.binary(max_size=12))


@settings(max_examples=400, deadline=None)
@given(prompt=st.one_of(st.text(max_size=60), st.binary(max_size=60)),
       params=st.dictionaries(st.text(max_size=6), st.one_of(
           params_values, st.lists(params_values, max_size=4)), max_size=5),
       float32=st.booleans())
def test_size_limits_agree_near_their_bounds(prompt: str | bytes, params: dict[str, Any],
                                             float32: bool) -> None:
    body = {"id": "r1", "task": "embed", "model": "t", "prompt": prompt, "params": params}
    data = msgpack.packb(body, use_bin_type=True, use_single_float=float32)
    [got] = decode_requests([data], TIGHT)
    _agree(got, reference(data, TIGHT))
