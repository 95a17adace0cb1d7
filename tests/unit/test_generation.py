"""Pure parts of generation: parameters, detokenization and stop strings, admission policy,
sampling, the stream reader. No Redis, no model."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from inferq.errors import ValidationError
from inferq.producer.streaming import StreamReader
from inferq.protocol.codec import Result, Status, build_request, decode_request, encode_request
from inferq.protocol.generation import FinishReason, GenerationParams, parse_generation_params
from inferq.worker.generate.kvcache import footprint
from inferq.worker.generate.scheduler import Budget, admit
from inferq.worker.models.detok import Detokenizer
from inferq.worker.models.sampling import choose, filter_logits, make_generator, seed_for

# ------------------------------------------------------------------------------- params


def test_generation_params_defaults_are_greedy() -> None:
    p = parse_generation_params({})
    assert p.greedy and p.max_new_tokens == 128 and p.stop == [] and p.seed is None


@pytest.mark.parametrize(("params", "field"), [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": "5"}, "max_new_tokens"),
    ({"max_new_tokens": 1 << 20}, "max_new_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"seed": -3}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["x"] * 9}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"max_tokens": 3}, "max_tokens"),
])
def test_bad_generation_params_are_named(params: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        parse_generation_params(params)


def test_stop_accepts_a_single_string() -> None:
    assert parse_generation_params({"stop": "\n\n"}).stop == ["\n\n"]


def test_messages_payload_round_trip_and_old_payloads_stay_valid() -> None:
    kw: dict[str, object] = dict(id="r1", model="m", task="generate", priority=0,
                                 deadline_s=None, params={"max_new_tokens": 4}, max_attempts=3)
    chat = build_request("", messages=[{"role": "user", "content": "hi"}], **kw)
    assert decode_request(encode_request(chat)) == chat
    plain = build_request("hello", **kw)
    assert "messages" not in __import__("msgpack").unpackb(encode_request(plain))
    with pytest.raises(ValidationError, match="either a prompt or messages"):
        build_request("hello", messages=[{"role": "user", "content": "hi"}], **kw)
    with pytest.raises(ValidationError, match="messages"):
        build_request("", messages=[{"role": "user"}], **kw)
    with pytest.raises(ValidationError, match="messages"):
        build_request("", messages="hi", **kw)
    with pytest.raises(ValidationError, match="messages"):
        build_request("", messages=[], **kw)


def test_cancelled_results_carry_finish_reason_cancelled() -> None:
    r = Result.model_validate({"id": "x", "status": "cancelled"})
    assert r.status is Status.CANCELLED and r.finish_reason is FinishReason.CANCELLED
    assert Result.model_validate({"id": "x", "status": "ok"}).finish_reason is None


# ------------------------------------------------------------------------- detokenizer

# A toy tokenizer: token t is the t-th string of this table; 9/10 are the two UTF-8 halves of é.
TABLE = ["", "Hello", ",", " wor", "ld", "!", " The", " end", ".", "\xc3", "\xa9"]


def toy_decode(ids: list[int] | tuple[int, ...]) -> str:
    data = "".join(TABLE[i] for i in ids).encode("latin-1")
    return data.decode("utf-8", errors="replace")


def run(tokens: list[int], stop: list[str] = ()) -> tuple[list[str], Detokenizer]:  # type: ignore[assignment]
    d = Detokenizer(toy_decode, [1], stop)
    deltas = []
    for t in tokens:
        d.add(t)
        deltas.append(d.delta())
        if d.stopped:
            break
    d.flush()
    deltas.append(d.delta(final=True))
    return deltas, d


def test_deltas_concatenate_to_the_full_decode() -> None:
    deltas, d = run([1, 2, 3, 4, 5])
    assert "".join(deltas) == d.text == "Hello, world!"


def test_split_multibyte_character_is_held_until_complete() -> None:
    deltas, d = run([6, 9, 10, 8])
    assert deltas[1] == "" and "é" in deltas[2]
    assert "".join(deltas) == d.text == " The\xe9."


def test_stop_string_cuts_the_text_and_is_never_streamed() -> None:
    deltas, d = run([1, 2, 3, 4, 5, 6, 7], stop=["orld!"])
    assert d.stopped and d.text == "Hello, w"
    assert "".join(deltas) == "Hello, w"
    assert not any("orl" in x for x in deltas)


def test_stop_string_spanning_tokens_is_found() -> None:
    deltas, d = run([1, 2, 3, 4, 5], stop=[", w"])
    assert d.text == "Hello" and "".join(deltas) == "Hello"


def test_text_that_may_start_a_stop_string_is_held_back() -> None:
    d = Detokenizer(toy_decode, [1], ["!!!"])
    d.add(1)
    assert d.delta() == "Hello"  # no end of "Hello" can start "!!!"
    d.add(5)
    assert d.delta() == ""  # "!" may be the start of "!!!"
    assert d.delta(final=True) == "!"


# --------------------------------------------------------------------------- scheduler


@dataclass
class Cand:
    name: str
    priority: int
    order: int
    prefill_tokens: int = 10
    reserve_tokens: int = 50


def fp(rows: int, longest: int) -> int:
    return footprint(rows, longest, 64)


def test_admission_is_in_priority_then_arrival_order() -> None:
    waiting = [Cand("a", 0, 1), Cand("b", 5, 2), Cand("c", 0, 0), Cand("d", 5, 3)]
    got = admit(waiting, [50], Budget(max_slots=4, kv_tokens=10**6, max_prefill_tokens=10**6),
                fp)
    assert [c.name for c in got] == ["b", "d", "c"]  # 3 free slots


def test_admission_stops_at_the_first_request_that_does_not_fit() -> None:
    budget = Budget(max_slots=16, kv_tokens=fp(4, 128), max_prefill_tokens=10**6)
    waiting = [Cand("big", 1, 0, reserve_tokens=4000), Cand("small", 0, 1)]
    assert admit(waiting, [100], budget, fp) == []  # no skipping past "big"
    assert [c.name for c in admit(waiting[1:], [100], budget, fp)] == ["small"]


def test_prefill_budget_spreads_a_burst_over_steps_but_always_admits_one() -> None:
    budget = Budget(max_slots=16, kv_tokens=10**6, max_prefill_tokens=100)
    waiting = [Cand(str(i), 0, i, prefill_tokens=60) for i in range(4)]
    assert len(admit(waiting, [], budget, fp)) == 1
    huge = [Cand("x", 0, 0, prefill_tokens=500)]
    assert len(admit(huge, [], budget, fp)) == 1


def test_footprint_counts_the_padded_rectangle_the_cache_allocates() -> None:
    assert footprint(1, 1, 16) == 4 * 64
    assert footprint(5, 65, 16) == 8 * 128
    assert footprint(15, 10, 16) == 16 * 64


# ---------------------------------------------------------------------------- sampling


@dataclass
class _Row:
    params: GenerationParams
    generator: torch.Generator | None
    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def test_sampling_is_reproducible_per_request_and_top_k_1_is_greedy() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    hot = GenerationParams(temperature=1.5, seed=7)
    a = [choose(logits, [_Row(hot, make_generator(7)) for _ in range(3)]) for _ in range(2)]
    assert a[0] == a[1]
    greedy = choose(logits, [_Row(GenerationParams(), None) for _ in range(3)])
    assert greedy == logits.argmax(-1).tolist()
    top1 = GenerationParams(temperature=1.0, top_k=1)
    assert choose(logits, [_Row(top1, make_generator(i)) for i in range(3)]) == greedy


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_logits(logits, GenerationParams(temperature=1.0, top_p=0.7))
    assert torch.isfinite(kept).tolist() == [True, True, False, False]


def test_default_seed_comes_from_the_request_id() -> None:
    p = GenerationParams(temperature=1.0)
    assert seed_for("abc", p) == seed_for("abc", p) != seed_for("abd", p)
    assert seed_for("abc", GenerationParams(temperature=1.0, seed=3)) == 3


# ------------------------------------------------------------------------ stream reader


def test_stream_reader_yields_every_delta_as_it_is_across_attempts() -> None:
    reader = StreamReader()
    reply = [[b"k", [(b"1-0", {b"a": b"1", b"d": b"Hel", b"k": b"7 8"}),
                     (b"2-0", {b"a": b"1", b"d": b"lo", b"k": b"9"})]]]
    assert reader.feed(reply) == ["Hel", "lo"]
    # The worker died; attempt 2 goes on from the streamed tokens: its text is new text, even
    # when it repeats what came before, and a token that shows no text yet yields nothing.
    more = [[b"k", [(b"3-0", {b"a": b"2", b"d": b"lo", b"k": b"9"}),
                    (b"4-0", {b"a": b"2", b"d": b"", b"k": b"10"}),
                    (b"5-0", {b"e": b"1"})]]]
    assert reader.feed(more) == ["lo"]
    assert reader.ended and reader.last_id == "5-0"
    assert reader.feed({"k": [["6-0", {"a": "2", "d": "!"}]]}) == ["!"]  # RESP3 shape
