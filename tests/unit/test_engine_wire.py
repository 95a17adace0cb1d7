"""The engine-process protocol: every message kind round-trips, each side decodes only what it
may receive, and a message whose fields do not match its type fails to decode (typed) instead
of being read shifted."""

from __future__ import annotations

import msgspec
import pytest

from inferq.worker.generate import wire

STATE = wire.EngineState(running=3, due=1, max_slots=8, step=42, device_allocated=7,
                         device_reserved=9)

TO_ENGINE: list[wire.ToEngine] = [
    wire.Submit([wire.GenerationSpec("r1", [1, 2, 3], {"max_new_tokens": 4, "stop": ["\n"]},
                                     priority=-5, order=7, alone=True, streamed=[9, 8],
                                     shown="héllo", trace_headers={"traceparent": "00-1-2-01"}),
                 wire.GenerationSpec("r2", [1], {}, priority=0, order=8, alone=False,
                                     streamed=[], shown="", trace_headers=None)]),
    wire.Cancel(["r1", "r2"]),
    wire.Withdraw(3, ["r1"]),
    wire.Stop(),
]
TO_WORKER: list[wire.ToWorker] = [
    wire.Ready(wire.BudgetSpec(8, 4096, 2048), 1.25),
    wire.Steps([wire.StepRecord(step=42, at=12.5, elapsed_s=0.002, admitted=["r3"],
                                prefill_tokens=17, preempted=["r1"],
                                advanced=[wire.Advanced("r2", 11, "a"),
                                          wire.Advanced("r3", 12, "")],
                                finished=[wire.Finished("r2", "length", "the whole text")])],
               STATE),
    wire.Capacity(STATE),
    wire.Cancelled(["r1"], lag_steps=1),
    wire.Failed("model_error", "RuntimeError: boom", True, ["r4"]),
    wire.OutOfMemory(6),
    wire.Withdrawn(3, ["r1"]),
    wire.Stopped(["r5"]),
]


def test_every_kind_has_exactly_one_message_type_and_a_sample_here() -> None:
    assert set(wire.MESSAGES) == set(wire.Kind)
    assert {type(m) for m in TO_ENGINE + TO_WORKER} == set(wire.MESSAGES.values())


@pytest.mark.parametrize("message", TO_ENGINE, ids=lambda m: type(m).__name__)
def test_worker_to_engine_messages_round_trip(message: wire.ToEngine) -> None:
    data = wire.encode(message)
    assert wire.decode_to_engine(data) == message
    assert msgspec.msgpack.decode(data)[0] == int(wire.Kind[_kind(message)])
    with pytest.raises(msgspec.ValidationError):
        wire.decode_to_worker(data)  # the worker never receives it


@pytest.mark.parametrize("message", TO_WORKER, ids=lambda m: type(m).__name__)
def test_engine_to_worker_messages_round_trip(message: wire.ToWorker) -> None:
    data = wire.encode(message)
    assert wire.decode_to_worker(data) == message
    assert msgspec.msgpack.decode(data)[0] == int(wire.Kind[_kind(message)])
    with pytest.raises(msgspec.ValidationError):
        wire.decode_to_engine(data)


def test_a_field_added_on_one_side_only_fails_to_decode_instead_of_shifting() -> None:
    raw = msgspec.msgpack.decode(wire.encode(wire.Failed("model_error", "boom", True, ["r"])))
    with pytest.raises(msgspec.ValidationError):
        wire.decode_to_worker(msgspec.msgpack.encode([*raw, "extra"]))
    with pytest.raises(msgspec.ValidationError):
        wire.decode_to_worker(msgspec.msgpack.encode(raw[:-1]))
    shifted = [raw[0], raw[1], True, "boom", raw[4]]  # two fields swapped
    with pytest.raises(msgspec.ValidationError):
        wire.decode_to_worker(msgspec.msgpack.encode(shifted))


def _kind(message: object) -> str:
    return {cls: kind.name for kind, cls in wire.MESSAGES.items()}[type(message)]
