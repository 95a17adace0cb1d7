"""``prepare_many``'s fast path for a list of plain prompts (``_prepare_prompts``) against the
one source of request validation, ``prepare``: the same requests (payload bytes, score band,
limits, cost, keys), and for a prompt that fails a check, the same error."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferq.errors import PayloadTooLarge, ValidationError
from inferq.producer.options import ClientOptions
from inferq.producer.prepare import Prepared, prepare, prepare_many, uuid4_hexes
from inferq.protocol.codec import Limits

OPTIONS = ClientOptions()
DEFAULTS: list[dict[str, Any]] = [
    {"model": "m"},
    {"model": "m", "task": "generate", "params": {"max_new_tokens": 7, "temperature": 0.5}},
    {"model": "m", "priority": 5, "deadline_s": 2.5, "max_attempts": 1, "tenant": "acme"},
    {"model": "m", "task": "custom", "cost": 9, "params": {"k": [1, 2.0, "x", None]}},
    {"model": "m", "priority": -3, "id": None, "params": None, "deadline_s": None},
]


def without_id(p: Prepared) -> tuple[Any, ...]:
    body = msgpack.unpackb(p.item.payload, raw=False)
    assert body.pop("id") == p.item.id
    return (dataclasses.replace(p.item, id="", payload=b""), msgpack.packb(body), p.keys,
            p.task, p.model, p.priority)


def slow(prompts: list[str], defaults: dict[str, Any],
         options: ClientOptions = OPTIONS) -> list[Prepared]:
    return [prepare(p, defaults, options, "client-1") for p in prompts]


@pytest.mark.parametrize("defaults", DEFAULTS)
@given(prompts=st.lists(st.text(min_size=1).filter(str.strip), min_size=2, max_size=8))
@settings(max_examples=40, deadline=None)
def test_the_fast_path_prepares_what_prepare_prepares(defaults: dict[str, Any],
                                                     prompts: list[str]) -> None:
    try:
        expected = slow(prompts, defaults)
    except ValidationError:  # a lone surrogate: covered below
        return
    fast = prepare_many(prompts, defaults, OPTIONS, reply_to="client-1")
    assert [without_id(p) for p in fast] == [without_id(p) for p in expected]
    assert len({p.item.id for p in fast}) == len(prompts)


@pytest.mark.parametrize("bad, error", [
    ("   ", ValidationError), ("\ud800", ValidationError), ("x" * 2000, PayloadTooLarge)])
@pytest.mark.parametrize("at", [0, 2])
def test_a_prompt_that_fails_a_check_raises_what_a_mapping_would(bad: str, error: type,
                                                                 at: int) -> None:
    options = ClientOptions(limits=Limits(max_prompt_bytes=1000))
    prompts = ["a", "b", "c"]
    prompts[at] = bad
    with pytest.raises(error) as fast:
        prepare_many(prompts, {"model": "m"}, options)
    with pytest.raises(error) as mapped:
        prepare_many([{"prompt": p} for p in prompts], {"model": "m"}, options)
    assert str(fast.value) == str(mapped.value) and f"request #{at}" in str(fast.value)


def test_a_payload_over_its_limit_fails_as_through_prepare() -> None:
    base = len(prepare("short", {"model": "m"}, OPTIONS).item.payload)
    options = ClientOptions(limits=Limits(max_payload_bytes=base + 30))
    prompts = ["short", "x" * 30, "y" * 200]
    with pytest.raises(PayloadTooLarge, match="request #2"):
        prepare_many(prompts, {"model": "m"}, options)


def test_bad_defaults_fail_at_the_first_prompt_as_before() -> None:
    with pytest.raises(ValidationError, match="request #0"):
        prepare_many(["a", "b"], {"model": "m", "priority": 1000}, OPTIONS)
    with pytest.raises(ValidationError, match=r"request #0: enqueue\(\) got an unexpected"):
        prepare_many(["a", "b"], {"model": "m", "colour": 1}, OPTIONS)


def test_a_generator_of_prompts_is_read_once() -> None:
    prepared = prepare_many((p for p in ["a", "b", "c"]), {"model": "m"}, OPTIONS)
    assert [msgpack.unpackb(p.item.payload)["prompt"] for p in prepared] == ["a", "b", "c"]


def test_ids_are_version_4_uuids_in_hex_like_uuid4() -> None:
    import uuid
    ids = uuid4_hexes(1000)
    assert len(set(ids)) == 1000
    for text in ids:
        parsed = uuid.UUID(hex=text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == text
