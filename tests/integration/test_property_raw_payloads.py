"""Property: whatever bytes a request's payload field ``p`` holds, the worker answers that
request alone with a failed result carrying a stable error code, serves the good requests
claimed next to it, and keeps running.

One in-process worker (``EchoModel``, small ``Limits``) runs on its own asyncio loop in a
background thread for the whole test; hypothesis drives examples from the test thread. Each
example enqueues (``Client.enqueue_many``, in a drawn order, so that good and bad requests
share claim windows) good requests and 1-3 requests whose ``p`` is then overwritten. The
worker's loop is held for those few milliseconds, and the overwrite is a compare-and-set on the
documented ``st`` field (``pending``, not yet claimed), so the worker only ever sees the
overwritten bytes; a request claimed first anyway is detected and must run as enqueued.

The bad payloads are random bytes, msgpack of random structures, and a valid payload with one
or more fields broken: wrong types, missing or extra fields, huge strings, NaN/inf/0/negative
``deadline_s``, out of range priorities, another id, task or model. Valid variants (another
prompt, priority, params, deadline; optional fields dropped) must succeed, with the payload's
own prompt as output.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

import inferq
from inferq.connection import ConnectionSettings
from inferq.errors import RequestError
from inferq.protocol.codec import MAX_DEADLINE_S, decode_request
from inferq.protocol.keys import QueueKeys
from inferq.worker.core.config import WorkerConfig
from inferq.worker.models.builtin import EchoModel
from inferq.worker.window.worker import WindowWorker
from tests.support.processes import wait_until
from tests.support.property import InputCounter, examples

LIMITS = inferq.Limits(max_prompt_bytes=128, max_params_bytes=256, max_payload_bytes=1024)
OPTIONS = inferq.ClientOptions(limits=LIMITS)
KEYS = QueueKeys.for_model("embed", "t")
WORKER_ID = "property-worker"
REQUIRED = ("id", "task", "model", "prompt")
FIELDS = ("v", "id", "task", "model", "prompt", "priority", "params", "deadline_s",
          "max_attempts")
RESULT_WAIT_S = 15.0
# Overwrite the payload only while the request is still unclaimed (the documented ``st`` field).
OVERWRITE_IF_PENDING = """
if redis.call('HGET', KEYS[1], 'st') == 'pending' then
  redis.call('HSET', KEYS[1], 'p', ARGV[1])
  return 1
end
return 0
"""


# ------------------------------------------------------------------------------ the worker


class BackgroundWorker:
    """A ``Worker`` on its own event loop in a daemon thread; ``alive`` while ``run`` is."""

    def __init__(self, worker: WindowWorker) -> None:
        self.worker = worker
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="property-worker",
                                       daemon=True)

    def __enter__(self) -> BackgroundWorker:
        self.thread.start()
        self.future = asyncio.run_coroutine_threadsafe(
            self.worker.run(install_signal_handlers=False), self.loop)
        return self

    @property
    def alive(self) -> bool:
        return not self.future.done()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the worker's event loop (it claims nothing meanwhile; the heartbeat thread
        goes on)."""
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            holding.set()
            release.wait(10)

        self.loop.call_soon_threadsafe(hold)
        assert holding.wait(10), "the worker's loop did not yield"
        try:
            yield
        finally:
            release.set()

    def why_dead(self) -> str:
        if self.alive:
            return "still running"
        exc = self.future.exception()
        return f"run() returned: {exc!r}" if exc else "run() returned without an error"

    def stop(self) -> None:
        """Ask for a clean stop and re-raise anything ``run`` raised."""
        self.loop.call_soon_threadsafe(self.worker.request_stop)
        self.future.result(timeout=30)

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self.alive:
                self.stop()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


def await_result(client: inferq.Client, request_id: str,
                 worker: BackgroundWorker) -> inferq.Result:
    """The stored result, failed or not; fails fast if the worker died meanwhile."""
    handle = client.handle(request_id, model="t")
    deadline = time.monotonic() + RESULT_WAIT_S
    while True:
        try:
            return handle.result(timeout=0.5)
        except RequestError as exc:
            return exc.result
        except inferq.ResultTimeout:
            assert worker.alive, f"the worker died: {worker.why_dead()}"
            assert time.monotonic() < deadline, f"no result for {request_id}"


# ---------------------------------------------------------------------------- bad payloads


@dataclass(frozen=True)
class Case:
    """One payload to write into ``p``: ``kind`` says how it is made from the valid payload
    (``base``) of the request it replaces. Rendered by ``render``."""

    kind: str
    field: str | None = None
    value: Any = None


def render(case: Case, base: dict[str, Any]) -> tuple[bytes, str | None]:
    """(bytes for ``p``, the error code the result must carry: None for "must succeed" and
    "any" where either is possible)."""
    body = dict(base)
    if case.kind == "bytes":
        data: bytes = case.value
        return data, by_size(data, "invalid_request")
    if case.kind == "structure":
        obj, use_bin_type = case.value
        data = msgpack.packb(obj, use_bin_type=use_bin_type)
        return data, by_size(data, "invalid_request")
    if case.kind == "truncated":
        data = msgpack.packb(body)
        return data[: max(0, min(case.value, len(data) - 1))], "invalid_request"
    if case.kind == "trailing":
        return msgpack.packb(body) + case.value, "invalid_request"
    if case.kind == "flip":
        data = bytearray(msgpack.packb(body))
        index, bit = case.value
        data[index % len(data)] ^= 1 << bit
        return bytes(data), "any"
    if case.kind == "set":  # one or more fields set to values the contract refuses
        body.update(case.value)
        code = "invalid_request"
    elif case.kind == "drop":
        del body[case.field]
        code = "invalid_request"
    elif case.kind == "extra":
        body[case.field] = case.value
        code = "invalid_request"
    elif case.kind == "foreign":  # well-formed, but for another request or queue
        body[case.field] = case.value
        code = "invalid_input"
    elif case.kind == "huge_prompt":
        body["prompt"] = "x" * case.value
        code = "payload_too_large"
    elif case.kind == "huge_field":
        body[case.field] = "x" * case.value
        code = "invalid_request"
    elif case.kind == "valid":
        body.update(case.value)
        for name in case.field or ():
            del body[name]
        code = None
    else:
        raise AssertionError(case.kind)
    data = msgpack.packb(body, use_bin_type=True)
    return data, by_size(data, code)


def by_size(data: bytes, code: str | None) -> str | None:
    return "payload_too_large" if len(data) > LIMITS.max_payload_bytes else code


# Values the contract (RequestPayload) refuses, field by field. pydantic's lax coercions that
# the contract tolerates (v=True or 1.0, deadline_s="5", bytes for str) are left out.
WRONG: dict[str, st.SearchStrategy[Any]] = {
    "v": st.sampled_from([0, 2, "1", None, 1.5, [1], -1]),
    "id": st.sampled_from([5, None, "", "bad id", "a" * 129, [], {}, b"\xff", 1.5, "-x",
                           "a\n", "é"]),
    "task": st.sampled_from(["", "a b", "a" * 65, 5, None, b"\xff", [], "{x}", "a:b"]),
    "model": st.sampled_from(["", "a b", "a" * 65, 5, None, b"\xff", [], "{x}", "../t"]),
    "prompt": st.sampled_from([42, None, [], {}, b"\xff\xfe", 1.5, True, ["a"], {"a": 1}]),
    "priority": st.one_of(
        st.integers(101, 2**64 - 1), st.integers(-(2**63), -101),
        st.sampled_from([True, False, 1.5, 5.0, "5", None, [], {}, math.nan])),
    "params": st.sampled_from([
        [], "x", 5, None, {"a": {"b": {"c": 1}}}, {"a": [[1]]}, {"a": [{"b": 1}]},
        {"a": msgpack.ExtType(5, b"x")}, {"a": {"b": [1]}}, {"a": b"\xff"}, [["a", 1]],
    ]),
    "deadline_s": st.one_of(
        st.floats(max_value=0.0), st.integers(-(2**63), 0),
        st.sampled_from([math.nan, math.inf, -math.inf, -0.0, "soon", "", "nan", "inf", [],
                         {}])),
    "max_attempts": st.one_of(
        st.integers(101, 2**64 - 1), st.integers(-(2**63), 0),
        st.sampled_from([True, False, 2.0, "3", None, []])),
}

msgpack_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
    st.text(max_size=20), st.binary(max_size=20),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
)
msgpack_keys = st.one_of(st.text(max_size=8), st.sampled_from(FIELDS), st.binary(max_size=4),
                         st.integers(-5, 5))
structures = st.recursive(
    msgpack_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(msgpack_keys, inner, max_size=5)),
    max_leaves=20,
)


def _not_all_required(obj: Any) -> Any:
    """A map might hold every required key (bytes keys decode as str when packed without the
    bin type) and be valid by chance: without a prompt it cannot be."""
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k not in ("prompt", b"prompt")}
    return obj


ok_text = st.text(st.characters(codec="utf-8"), max_size=30)
ok_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                       st.floats(allow_nan=False), st.text(max_size=8))
VALID: dict[str, st.SearchStrategy[Any]] = {
    "prompt": ok_text,
    "priority": st.integers(-100, 100),
    "params": st.dictionaries(st.text(max_size=6), st.one_of(
        ok_scalars, st.lists(ok_scalars, max_size=3),
        st.dictionaries(st.text(max_size=4), ok_scalars, max_size=3)), max_size=3),
    "deadline_s": st.one_of(st.none(), st.floats(min_value=1e-3, max_value=MAX_DEADLINE_S)),
    "max_attempts": st.integers(1, 100),
}

cases = st.one_of(
    st.builds(Case, st.just("bytes"), st.none(), st.binary(max_size=64)),
    st.builds(Case, st.just("bytes"), st.none(),
              st.binary(min_size=LIMITS.max_payload_bytes + 1,
                        max_size=LIMITS.max_payload_bytes + 64)),
    st.builds(Case, st.just("bytes"), st.none(),
              st.sampled_from([b"", b"\xc1", b"\x80", b"\x81", b"\xd6\xff\x00\x00\x00\x00",
                               b"\xc7\x03\xff\x00\x00\x00", b"\xdd\xff\xff\xff\xff",
                               b"\x91" * 2000, b"\x81\x01\x02", b"\x81\xc0\x01"])),
    st.builds(Case, st.just("structure"), st.none(),
              st.tuples(structures.map(_not_all_required), st.booleans())),
    st.builds(Case, st.just("truncated"), st.none(), st.integers(0, 200)),
    st.builds(Case, st.just("trailing"), st.none(), st.binary(min_size=1, max_size=8)),
    st.builds(Case, st.just("flip"), st.none(), st.tuples(st.integers(0, 300),
                                                          st.integers(0, 7))),
    st.builds(Case, st.just("set"), st.none(), st.sampled_from(sorted(WRONG)).flatmap(
        lambda name: WRONG[name].map(lambda value: {name: value}))),
    st.builds(Case, st.just("set"), st.none(),  # several broken fields at once
              st.dictionaries(st.sampled_from(sorted(WRONG)), st.none(), min_size=2)
              .flatmap(lambda d: st.fixed_dictionaries({k: WRONG[k] for k in d}))),
    st.builds(Case, st.just("drop"), st.sampled_from(REQUIRED)),
    st.builds(Case, st.just("extra"),
              st.one_of(st.text(max_size=10).filter(lambda k: k not in FIELDS),
                        st.sampled_from(["Prompt", "id ", "_v", "deadline"])),
              st.one_of(st.none(), st.integers(0, 9), st.text(max_size=4))),
    st.builds(Case, st.just("foreign"), st.just("id"),
              st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,20}", fullmatch=True)),
    st.builds(Case, st.just("foreign"), st.sampled_from(["task", "model"]),
              st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
              .filter(lambda name: name not in ("embed", "t"))),
    st.builds(Case, st.just("huge_prompt"), st.none(),
              st.one_of(st.integers(LIMITS.max_prompt_bytes + 1, 900),
                        st.sampled_from([1100, 100_000, 3 << 20]))),
    st.builds(Case, st.just("huge_field"), st.sampled_from(["id", "task", "model", "v"]),
              st.sampled_from([200, 900, 5000])),
    st.builds(Case, st.just("valid"),
              st.sets(st.sampled_from(["v", "priority", "params", "deadline_s",
                                       "max_attempts"])).map(sorted),
              st.sampled_from(sorted(VALID)).flatmap(
                  lambda name: VALID[name].map(lambda value: {name: value}))),
)


# ------------------------------------------------------------------------------- property


@pytest.fixture
def background_worker(redis_url: str, r: redis.Redis) -> Iterator[BackgroundWorker]:
    config = WorkerConfig(connection=ConnectionSettings(redis_url), model_name="t",
                          model_spec="builtin:echo",
                          max_batch_size=16, max_wait_ms=2, lease_ms=10_000,
                          worker_id=WORKER_ID, limits=LIMITS)
    with BackgroundWorker(WindowWorker(config, EchoModel())) as bg:
        wait_until(lambda: r.zscore(KEYS.workers, WORKER_ID) is not None, 15, "worker start")
        yield bg


def test_bad_payloads_fail_alone_and_the_worker_lives_on(
        background_worker: BackgroundWorker, r: redis.Redis, redis_url: str,
        inputs: InputCounter) -> None:
    client = inferq.Client(redis_url, options=OPTIONS)
    overwrite = r.register_script(OVERWRITE_IF_PENDING)
    expected_failures = 0

    @settings(max_examples=examples(500))
    @given(bad=st.lists(cases, min_size=1, max_size=3),
           good=st.lists(ok_text.filter(str.strip), min_size=1, max_size=2),
           order=st.randoms(use_true_random=False))
    def prop(bad: list[Case], good: list[str], order: Any) -> None:
        nonlocal expected_failures
        requests: list[tuple[str, Case | None, str]] = [(uuid.uuid4().hex, None, g)
                                                        for g in good]
        requests += [(uuid.uuid4().hex, case, "placeholder") for case in bad]
        order.shuffle(requests)
        expected: dict[str, tuple[bytes, str | None]] = {}
        with background_worker.held():
            handles = client.enqueue_many(
                [{"prompt": prompt, "id": rid} for rid, _, prompt in requests], model="t")
            assert [h.outcome for h in handles] == ["queued"] * len(requests)
            for rid, case, _ in requests:
                if case is not None:
                    key = KEYS.request(rid)
                    raw, code = render(case, msgpack.unpackb(r.hget(key, "p")))
                    if overwrite(keys=[key], args=[raw]) == 1:
                        expected[rid] = (raw, code)
                    else:  # claimed before the overwrite: runs as it was enqueued
                        inputs.outcome("raced (not counted)")

        inputs.tried(len(expected))
        for rid, case, prompt in requests:
            result = await_result(client, rid, background_worker)
            assert result.id == rid
            assert result.attempts == 1 and result.worker == WORKER_ID
            assert not r.exists(KEYS.request(rid))
            if case is None or rid not in expected:
                assert result.ok, f"a good request was hurt: {result}"
                assert result.output == prompt
                continue
            raw, code = expected[rid]
            if code == "any":  # a flipped bit: either a valid payload or a typed refusal
                code = check_flip(raw, rid)
            if code is None:
                assert result.ok, f"{case} was refused: {result.error}"
                assert result.output == decode_request(raw, LIMITS).prompt
                inputs.outcome("ok (valid variant)")
                continue
            assert result.status is inferq.Status.FAILED, f"{case} got {result}"
            assert result.error is not None
            assert result.error.code == code, f"{case}: {result.error} (expected {code})"
            assert isinstance(result.error.message, str) and result.error.message
            assert result.output is None
            inputs.outcome(code)
            expected_failures += 1
        assert background_worker.alive, background_worker.why_dead()

    try:
        prop()
        assert background_worker.alive, background_worker.why_dead()
        assert r.zcard(KEYS.pending) == 0 and r.zcard(KEYS.inflight) == 0
        last = client.enqueue("still serving", model="t")
        assert await_result(client, last.id, background_worker).output == "still serving"
        stats = background_worker.worker.stats
        background_worker.stop()  # a clean stop: run() raises nothing
        assert stats.failed == expected_failures
        assert stats.refused == 0
    finally:
        client.close()


def check_flip(raw: bytes, request_id: str) -> str | None:
    """What a payload with one flipped bit must produce: success if it still decodes to a
    request for this queue and id, else the typed refusal that decoding gives. (The codec is
    the oracle here; the property under test is that the worker applies it to this request
    alone and lives on.)"""
    try:
        payload = decode_request(raw, LIMITS)
    except inferq.InferqError as exc:
        return exc.code
    if (payload.task, payload.model, payload.id) != ("embed", "t", request_id):
        return "invalid_input"
    return None
