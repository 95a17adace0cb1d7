"""Property: any arguments to ``Client.enqueue`` / ``enqueue_many`` either queue each request
exactly once, holding exactly the data given, or raise a typed ``inferq.InferqError`` with a
stable code and leave Redis untouched.

Hypothesis draws arguments that are mostly valid with zero, one or two fields made bad
(prompts with unicode, lone surrogates, sizes around and far past small ``Limits``; priorities
in and far out of range, bools, floats, strings; deadlines NaN, inf, 0, negative, huge,
strings; ids and names valid and not; params nested, non-JSON, bytes, huge, not a mapping).
An independent oracle (``judge``) predicts each outcome from the documented contract
(``RequestPayload``'s types, the id and name patterns, ``Limits``); the property checks the
SDK against it:

* a valid call succeeds, and Redis then holds the request once in its queue's pending set,
  its hash, and a msgpack payload equal (type for type) to the arguments;
* an invalid call raises ``inferq.ValidationError`` (``invalid_request``) or
  ``PayloadTooLarge`` (``payload_too_large``), never a bare ``TypeError``/``ValueError``/
  ``UnicodeEncodeError``/``OverflowError``/pydantic error, and every key in Redis is
  byte-for-byte what it was (``DUMP`` of each key).

The oracle states the order the SDK checks in, since the first refusal decides the code: the
fields' types and patterns, then the prompt's text (lone surrogates) and size, then whether
msgpack can carry the params (lone surrogates, ints beyond 64 bits) and their size, then the
whole payload's size. The bugs this property found are fixed; each keeps a minimal regression
test at the end of this file.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import event, given, settings
from hypothesis import strategies as st

import inferq
from inferq.protocol.codec import MAX_DEADLINE_S
from inferq.protocol.keys import QueueKeys, requested_registry
from tests.support.property import InputCounter, examples

LIMITS = inferq.Limits(max_prompt_bytes=256, max_params_bytes=128, max_payload_bytes=512)
OPTIONS = inferq.ClientOptions(limits=LIMITS)
SEQ_BITS = 45  # scores.py: score = (100 - priority) * 2**45 + tag

# The documented contract, restated independently of inferq's code.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,192}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MSGPACK_INTS = range(-(2**63), 2**64)
KWARGS = frozenset({"prompt", "model", "task", "priority", "deadline_s", "id", "params",
                    "max_attempts"})

# ------------------------------------------------------------------------------------ oracle


class _Invalid(Exception):
    """The oracle's verdict that pydantic/inferq must refuse the value."""


@dataclass
class Verdict:
    """What one request must do: ``ok`` (be queued as ``payload``) or ``error`` (raise a typed
    error with ``code``)."""

    kind: str
    code: str | None = None
    payload: dict[str, Any] | None = None


@dataclass
class _Scan:
    """What msgpack cannot carry, found in the params."""

    surrogates: bool = False
    big_int: bool = False


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _text(value: object, pattern: re.Pattern[str]) -> str:
    """A str field with a pattern; pydantic's lax mode also takes UTF-8 bytes."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid from None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _Invalid
    return value


def _key(value: object, scan: _Scan) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid from None
    if not isinstance(value, str):
        raise _Invalid
    scan.surrogates |= _has_surrogate(value)
    return value


def _scalar(value: object, scan: _Scan) -> object:
    """JSONScalar = str | int | float | bool | None (bytes become str in lax mode)."""
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        scan.big_int |= value not in MSGPACK_INTS
        return value
    return _key(value, scan)


def _param_value(value: object, scan: _Scan) -> object:
    """ParamValue = JSONScalar | list[JSONScalar] | dict[str, JSONScalar]."""
    if isinstance(value, list | tuple):
        return [_scalar(v, scan) for v in value]
    if isinstance(value, dict):
        return {_key(k, scan): _scalar(v, scan) for k, v in value.items()}
    return _scalar(value, scan)


def _deadline(value: object, scan: _Scan) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool | str | bytes):
        raise _Invalid  # deadline_s is strict: a number of seconds, not text or a bool
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            raise _Invalid from None
    else:
        raise _Invalid
    if not math.isfinite(number) or number <= 0 or number > MAX_DEADLINE_S:
        raise _Invalid
    return number


def _strict_int(value: object, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _Invalid
    return value


def judge(prompt: object, kw: Mapping[str, Any]) -> Verdict:
    """The outcome the contract demands for ``enqueue(prompt, **kw)``."""
    scan = _Scan()
    params = kw.get("params")
    if params is not None and not isinstance(params, Mapping):
        return Verdict("error", code="invalid_request")  # refused before anything else
    try:
        if not isinstance(prompt, str):
            raise _Invalid
        request_id = None if kw.get("id") is None else _text(kw["id"], ID_RE)
        payload: dict[str, Any] = {
            "v": 1,
            "id": request_id,
            "task": _text(kw.get("task", "embed"), NAME_RE),
            "model": _text(kw["model"], NAME_RE),
            "prompt": str(prompt),
            "priority": _strict_int(kw.get("priority", 0), -100, 100),
            "params": {_key(k, scan): _param_value(v, scan)
                       for k, v in (params or {}).items()},
            "deadline_s": _deadline(kw.get("deadline_s"), scan),
            "max_attempts": _strict_int(kw.get("max_attempts", 3), 1, 100),
        }
    except _Invalid:
        return Verdict("error", code="invalid_request")
    if not prompt.strip():  # an empty or whitespace-only input is refused, as OpenAI's API does
        return Verdict("error", code="invalid_request")
    if _has_surrogate(prompt):
        return Verdict("error", code="invalid_request")
    if len(prompt.encode()) > LIMITS.max_prompt_bytes:
        return Verdict("error", code="payload_too_large")
    if scan.surrogates or scan.big_int:
        return Verdict("error", code="invalid_request")
    sized = dict(payload, id=payload["id"] or "0" * 32)
    if (len(msgpack.packb(payload["params"])) > LIMITS.max_params_bytes
            or len(msgpack.packb(sized)) > LIMITS.max_payload_bytes):
        return Verdict("error", code="payload_too_large")
    return Verdict("ok", payload=payload)


def judge_item(item: object, defaults: Mapping[str, Any]) -> Verdict:
    """The outcome for one element of ``enqueue_many(requests, **defaults)``."""
    if isinstance(item, str):
        spec = {**defaults, "prompt": item}
    elif isinstance(item, Mapping):
        spec = {**defaults, **item}
    else:
        return Verdict("error", code="invalid_request")
    if "prompt" not in spec or "model" not in spec or not set(spec) <= KWARGS:
        return Verdict("error", code="invalid_request")
    prompt = spec.pop("prompt")
    return judge(prompt, spec)


def same(a: object, b: object) -> bool:
    """Equal and of the same type all the way down (NaN equals NaN, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


# -------------------------------------------------------------------------------- strategies

surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
with_surrogates = st.tuples(st.text(max_size=6), surrogate, st.text(max_size=6)).map("".join)


def repeated(chars: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(chars), st.integers(low, high)).map(lambda t: t[0] * t[1])


prompts_ok = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=60),
    repeated("aé€😀", 1, 260),  # 1 to 4 bytes a character: around the 256-byte limit
)
prompts_bad = st.one_of(
    with_surrogates,
    st.sampled_from([257, 10_000, 1 << 20]).map("x".__mul__),
    st.none(), st.integers(), st.floats(), st.binary(max_size=8),
    st.lists(st.text(max_size=2), max_size=2),
)

ids_ok = st.one_of(st.none(), st.from_regex(ID_RE, fullmatch=True))
ids_bad = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "a" * 128, "a" * 129, "a" * 10_000, "-x", ".x", "a b", "a/b", "a\n",
                     "é", "{a}", "a*", "a\x00"]),
    st.integers(), st.floats(), st.binary(max_size=6), st.lists(st.integers(), max_size=1),
)

names_ok = st.one_of(st.sampled_from(["t", "embed", "m-1.x_y", "A" * 64]),
                     st.from_regex(NAME_RE, fullmatch=True))
names_bad = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["", "a" * 65, "a:b", "{t}", "a b", "é", "../etc", "t\n", "*", b"t",
                     b"\xff"]),
    st.none(), st.integers(),
)

priorities_ok = st.integers(-100, 100)
priorities_bad = st.one_of(
    st.integers(), st.sampled_from([-101, 101, 2**63, -(2**63) - 1, 10**30]), st.booleans(),
    st.floats(), st.just(5.0), st.text(max_size=4), st.none(),
)

deadlines_ok = st.one_of(st.none(), st.floats(min_value=1e-3, max_value=1e6),
                         st.integers(1, 10**6))
deadlines_bad = st.one_of(
    st.floats(),
    st.floats(min_value=1.8e305, max_value=1.7976931348623157e308),  # ms overflow to inf
    st.sampled_from([0, 0.0, -0.0, -1, 5e-324, 1e-300, 1e300, 1e305, 1e308,
                     1.7976931348623157e308, 10**306, 10**400, math.nan, math.inf, -math.inf]),
    st.integers(), st.booleans(),
    st.sampled_from(["5", "1.5", " 2 ", "soon", "", "nan", "inf", "-1", "0", "1e3", b"5",
                     b"x"]),
    st.lists(st.floats(), max_size=1),
)

scalars_ok = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                       st.text(max_size=10))
scalars_any = st.one_of(
    scalars_ok, st.integers(), st.sampled_from([2**64, -(2**63) - 1, 10**40]), with_surrogates,
    st.binary(max_size=6), st.complex_numbers(max_magnitude=10), st.dates(),
    st.builds(object), st.just(datetime.timedelta(seconds=1)),
)
keys_any = st.one_of(st.text(max_size=6), with_surrogates, st.binary(max_size=4), st.integers(),
                     st.none(), st.tuples(st.integers()))
params_ok = st.dictionaries(
    st.text(max_size=8),
    st.one_of(scalars_ok, st.lists(scalars_ok, max_size=4),
              st.dictionaries(st.text(max_size=4), scalars_ok, max_size=3)),
    max_size=4,
)
params_bad = st.one_of(
    st.dictionaries(st.text(max_size=4),
                    st.sampled_from([2**64, -(2**63) - 1, 10**40]).map(lambda n: [n]), min_size=1,
                    max_size=2),
    st.dictionaries(st.text(max_size=4), with_surrogates, min_size=1, max_size=2),
    st.dictionaries(
        keys_any,
        st.one_of(scalars_any,
                  st.lists(st.one_of(scalars_any, st.lists(scalars_ok, max_size=2)),
                           max_size=3),
                  st.tuples(scalars_any),
                  st.dictionaries(keys_any, st.one_of(scalars_any, st.lists(scalars_ok,
                                                                            max_size=2)),
                                  max_size=2)),
        max_size=4,
    ),
    st.sampled_from([100, 10_000]).map(lambda n: {"k": "v" * n}),
    st.lists(st.integers(), max_size=3), st.text(max_size=3), st.integers(),
    st.lists(st.tuples(st.text(max_size=3), st.integers()), max_size=2), st.binary(max_size=3),
)

max_attempts_ok = st.integers(1, 100)
max_attempts_bad = st.one_of(st.integers(), st.booleans(), st.floats(), st.just(3.0),
                             st.text(max_size=3), st.none())

FIELDS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "prompt": (prompts_ok, prompts_bad),
    "model": (names_ok, names_bad),
    "task": (names_ok, names_bad),
    "id": (ids_ok, ids_bad),
    "priority": (priorities_ok, priorities_bad),
    "deadline_s": (deadlines_ok, deadlines_bad),
    "params": (params_ok, params_bad),
    "max_attempts": (max_attempts_ok, max_attempts_bad),
}
OPTIONAL = ["task", "id", "priority", "deadline_s", "params", "max_attempts"]


@st.composite
def call_args(draw: st.DrawFn, *, model: bool = True) -> tuple[Any, dict[str, Any]]:
    """(prompt, kwargs): mostly valid, with zero, one or two fields drawn from the bad side."""
    bad = draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=2))
    given_ = draw(st.sets(st.sampled_from(OPTIONAL)))

    def value(name: str) -> Any:
        ok, wrong = FIELDS[name]
        return draw(wrong if name in bad else ok)

    prompt = value("prompt")
    kw = {name: value(name) for name in OPTIONAL if name in bad or name in given_}
    if model or "model" in bad:
        kw["model"] = value("model")
    for name in sorted(bad):
        event(f"bad {name}")
    return prompt, kw


@st.composite
def many_args(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """(requests, defaults) for ``enqueue_many``: prompts, mappings, junk; shared ids."""
    defaults: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        defaults["model"] = draw(names_ok)
    if not draw(st.integers(0, 4)):
        _, extra = draw(call_args(model=False))
        defaults.update(extra)
    if not draw(st.integers(0, 9)):
        defaults[draw(st.sampled_from(["foo", "options", "reply_to"]))] = 1

    def mapping(args: tuple[Any, dict[str, Any]]) -> dict[Any, Any]:
        prompt, kw = args
        return {"prompt": prompt, **kw}

    items = st.one_of(
        prompts_ok,
        prompts_bad,
        call_args(model=False).map(mapping),
        call_args().map(mapping),
        st.tuples(call_args().map(mapping), st.sampled_from(["dup-1", "dup-2"]))
        .map(lambda t: {**t[0], "id": t[1]}),
        st.tuples(call_args().map(mapping),
                  st.sampled_from(["foo", "options", "reply_to", 1, "Prompt"]))
        .map(lambda t: {**t[0], t[1]: None}),
        st.fixed_dictionaries({}, optional={"prompt": prompts_ok, "model": names_ok}),
        st.none(), st.integers(), st.binary(max_size=3),
    )
    requests = draw(st.lists(items, max_size=5))
    if draw(st.booleans()):
        return tuple(requests), defaults
    return requests, defaults


# -------------------------------------------------------------------------- Redis checking


def snapshot(r: redis.Redis) -> dict[bytes, bytes]:
    """Every key and its serialized value: equal snapshots mean nothing changed."""
    return {key: r.dump(key) for key in r.scan_iter(count=1000)}  # type: ignore[misc]


def fresh_db(r: redis.Redis, client: inferq.Client) -> dict[bytes, bytes]:
    """An empty database but for one request in another queue, which must stay untouched."""
    r.flushdb()
    client.enqueue("sentinel", model="zz-sentinel", task="zz-sentinel", id="sentinel")
    return snapshot(r)


@dataclass
class Outcome:
    handles: list[inferq.Handle] | None = None
    error: BaseException | None = None


def attempt(call: Any) -> Outcome:
    try:
        result = call()
    except Exception as exc:
        return Outcome(error=exc)
    return Outcome(handles=result if isinstance(result, list) else [result])


def combine(verdicts: list[Verdict]) -> str | None:
    """Requests are validated in order and the first refusal stops the call: the error code that
    must come out, or None where the call must succeed."""
    for verdict in verdicts:
        if verdict.kind == "error":
            assert verdict.code is not None
            return verdict.code
    return None


def check(r: redis.Redis, before: dict[bytes, bytes], verdicts: list[Verdict],
          outcome: Outcome, inputs: InputCounter) -> None:
    code = combine(verdicts)
    if outcome.error is not None:
        exc = outcome.error
        if not isinstance(exc, inferq.InferqError):
            raise AssertionError(
                f"untyped {type(exc).__module__}.{type(exc).__name__} leaked: {exc}") from exc
        event(f"error {exc.code}")
        inputs.outcome(exc.code)
        assert code is not None, f"valid input refused: {exc!r}"
        assert isinstance(exc, inferq.ValidationError), repr(exc)
        assert exc.code == code, f"{exc.code} but expected {code}: {exc}"
        assert str(exc)
        assert snapshot(r) == before, "a refused call changed Redis"
        return
    assert outcome.handles is not None
    assert code is None, f"accepted, but expected an error with code {code}"
    event("queued")
    inputs.outcome("queued")
    check_stored(r, before, verdicts, outcome.handles)


def check_stored(r: redis.Redis, before: dict[bytes, bytes], verdicts: list[Verdict],
                 handles: list[inferq.Handle]) -> None:
    """Each request is in its queue exactly once and decodes to exactly the data given."""
    assert len(handles) == len(verdicts)
    after = snapshot(r)
    registry = requested_registry()
    for key, value in before.items():
        if key != registry.encode():  # gains the queues enqueued to (checked below)
            assert after.get(key) == value, f"unrelated key {key!r} changed"
    expected_keys: set[str] = set()
    pending: dict[str, set[str]] = {}
    first: dict[tuple[str, str], int] = {}
    for index, (verdict, handle) in enumerate(zip(verdicts, handles, strict=True)):
        payload = verdict.payload
        assert payload is not None
        keys = QueueKeys.for_model(payload["task"], payload["model"])
        assert handle.keys == keys
        if payload["id"] is None:
            assert re.fullmatch(r"[0-9a-f]{32}", handle.id), handle.id
        else:
            assert handle.id == payload["id"]
        if (keys.queue, handle.id) in first:  # a repeated id: the first request stands
            assert handle.outcome == "pending", handle
            continue
        first[keys.queue, handle.id] = index
        assert handle.outcome == "queued", handle
        expected_keys |= {keys.pending, keys.seq, keys.wake, keys.fair, keys.request(handle.id)}
        pending.setdefault(keys.pending, set()).add(handle.id)
        stored_hash = r.hgetall(keys.request(handle.id))
        stored = msgpack.unpackb(stored_hash[b"p"], raw=False)
        expected = dict(payload, id=handle.id)
        assert same(stored, expected), f"stored {stored!r}\nexpected {expected!r}"
        assert stored_hash[b"st"] == b"pending"
        assert int(stored_hash[b"ma"]) == payload["max_attempts"]
        assert (b"dl" in stored_hash) == (payload["deadline_s"] is not None)
        score = r.zscore(keys.pending, handle.id)
        assert score is not None
        assert int(score) >> SEQ_BITS == 100 - payload["priority"]
    new_keys = {k.decode() for k in set(after) - set(before)}
    # Enqueueing registers the queue for ``inferq stats`` (at most every few seconds per queue,
    # so one client across examples may or may not have written it in this one).
    if registry in new_keys:
        assert expected_keys and r.smembers(registry) <= {
            QueueKeys.for_model(v.payload["task"], v.payload["model"]).queue.encode()
            for v in verdicts if v.payload is not None}
    assert new_keys - {registry} == expected_keys
    for key, ids in pending.items():
        assert {m.decode() for m in r.zrange(key, 0, -1)} == ids  # once each, nothing else


# ------------------------------------------------------------------------------- properties


@pytest.fixture
def small_client(redis_url: str) -> Iterator[inferq.Client]:
    with inferq.Client(redis_url, options=OPTIONS) as c:
        yield c


def test_enqueue_queues_exactly_the_data_or_raises_a_typed_error(
        small_client: inferq.Client, r: redis.Redis, inputs: InputCounter) -> None:
    @settings(max_examples=examples(600))
    @given(call_args())
    def prop(args: tuple[Any, dict[str, Any]]) -> None:
        inputs.tried()
        prompt, kw = args
        before = fresh_db(r, small_client)
        outcome = attempt(lambda: small_client.enqueue(prompt, **kw))
        check(r, before, [judge(prompt, kw)], outcome, inputs)

    prop()


def test_enqueue_many_is_all_or_nothing_with_typed_errors(
        small_client: inferq.Client, r: redis.Redis, inputs: InputCounter) -> None:
    @settings(max_examples=examples(300))
    @given(many_args())
    def prop(args: tuple[Any, dict[str, Any]]) -> None:
        inputs.tried()
        requests, defaults = args
        before = fresh_db(r, small_client)
        outcome = attempt(lambda: small_client.enqueue_many(requests, **defaults))
        check(r, before, [judge_item(item, defaults) for item in requests], outcome, inputs)

    prop()


def test_valid_arguments_are_always_accepted(small_client: inferq.Client, r: redis.Redis,
                                             inputs: InputCounter) -> None:
    """The other half of the contract: nothing valid is refused, at any size up to the
    limits (the oracle is not allowed to call these inputs anything but ``ok``)."""
    fits = st.tuples(prompts_ok, st.fixed_dictionaries(
        {"model": names_ok},
        optional={name: FIELDS[name][0] for name in OPTIONAL},
    )).filter(lambda a: judge(*a).kind == "ok")

    @settings(max_examples=examples(200))
    @given(fits)
    def prop(args: tuple[str, dict[str, Any]]) -> None:
        inputs.tried()
        prompt, kw = args
        before = fresh_db(r, small_client)
        handle = small_client.enqueue(prompt, **kw)
        inputs.outcome("queued")
        check_stored(r, before, [judge(prompt, kw)], [handle])

    prop()


# ------------------------------------------------- fixed bugs: minimal repros (regressions)


# Each call once leaked the exception in its comment (or was accepted); now each must be refused
# with a typed error and leave Redis untouched.
BUG_REPROS = [
    # UnicodeEncodeError from prompt.encode("utf-8") in encode_request (a lone surrogate)
    pytest.param(lambda c: c.enqueue("a\ud800b", model="t"), id="surrogate-in-prompt"),
    # UnicodeEncodeError from msgpack.packb(params)
    pytest.param(lambda c: c.enqueue("x", model="t", params={"k": "\udcff"}),
                 id="surrogate-in-params"),
    # OverflowError from msgpack.packb(params): an int outside [-2**63, 2**64)
    pytest.param(lambda c: c.enqueue("x", model="t", params={"k": 2**64}),
                 id="int-beyond-msgpack-in-params"),
    # TypeError / ValueError from prepare()'s dict(params) before validation
    pytest.param(lambda c: c.enqueue("x", model="t", params=[1, 2]), id="params-a-list"),
    pytest.param(lambda c: c.enqueue("x", model="t", params="ab"), id="params-a-str"),
    # ValueError: prepare_many converted only TypeError
    pytest.param(lambda c: c.enqueue_many([{"prompt": "x", "params": "ab"}], model="t"),
                 id="enqueue-many-params-a-str"),
    # accepted: dict(params) took an iterable of pairs
    pytest.param(lambda c: c.enqueue("x", model="t", params=[("k", 1)]),
                 id="params-pairs-accepted"),
    # OverflowError from round(deadline_s * 1e3) overflowing to inf
    pytest.param(lambda c: c.enqueue("x", model="t", deadline_s=1e308),
                 id="deadline-ms-overflow"),
    # accepted: deadline_s was a lax float (True meant 1 s, "5" meant 5 s)
    pytest.param(lambda c: c.enqueue("x", model="t", deadline_s=True), id="deadline-bool"),
    pytest.param(lambda c: c.enqueue("x", model="t", deadline_s="5"), id="deadline-str"),
    # TypeError from prepare_many iterating requests unguarded
    pytest.param(lambda c: c.enqueue_many(5, model="t"), id="enqueue-many-not-iterable"),
]


@pytest.mark.parametrize("call", BUG_REPROS)
def test_known_bug_gets_a_typed_error_and_changes_nothing(
        call: Any, client: inferq.Client, r: redis.Redis) -> None:
    with pytest.raises(inferq.ValidationError) as info:
        call(client)
    assert info.value.code == "invalid_request"
    assert r.dbsize() == 0
